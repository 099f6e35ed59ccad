//! The declaration form of the guest protocol: [`guest_protocol!`] turns one
//! table of requests and responses into the [`Request`](crate::Request) and
//! [`Response`](crate::Response) enums, their `kind` tags, one typed call
//! per request ([`crate::call`]) and the answer each call expects.
//!
//! Owns the traits that tie a request to its answer ([`Call`], [`Answer`]).
//! It must never hold message contents or policy: the table itself lives
//! in [`crate::guest`], and what a peer does with a message is the peer's.

/// A response that answers some request: the typed content of one
/// [`Response`](crate::Response) variant.
pub trait Answer: Sized {
    /// Its `kind` tag on the wire.
    const KIND: &'static str;
    /// Takes this answer out of `response`, or hands the response back when
    /// it is of another kind.
    // The error is the caller's own response given back whole, not a new
    // value: boxing it would only add an allocation.
    #[allow(clippy::result_large_err)]
    fn from_response(response: crate::Response) -> Result<Self, crate::Response>;
    /// Wraps it into a response.
    fn into_response(self) -> crate::Response;
}

/// A request with a typed answer: one struct per
/// [`Request`](crate::Request) variant, in [`crate::call`]. A client sends
/// `C::into()` and expects a [`Call::Answer`]; anything else that comes back
/// is a protocol error of the peer.
pub trait Call: Into<crate::Request> {
    /// Its `kind` tag on the wire.
    const KIND: &'static str;
    /// What answers it (for `watch`: each item of the stream).
    type Answer: Answer;
}

/// Declares the guest protocol. Used once, in [`crate::guest`].
///
/// ```text
/// guest_protocol! {
///     requests {
///         /// docs
///         "kind" => Variant { field: Type, ... } -> AnswerType;   // fields optional
///         "kind" => Variant(Type) -> AnswerType, payload;         // a newtype request
///     }
///     responses {
///         /// docs
///         "kind" => Variant(Type);                                // a newtype answer
///         "kind" => Variant { field: Type, ... } as Struct;       // a struct answer
///         "kind" => Variant(Type), payload;                       // may carry a payload
///     }
/// }
/// ```
///
/// It yields `Request` and `Response` (with a fixed last `Error` variant,
/// kind `"error"`), `KINDS` and `kind()` for both, `Response::error`,
/// `payload_allowed()` for both, one struct `call::Variant` per request with
/// `impl Call` and `From<call::Variant> for Request`, and `impl Answer` for
/// every answer type (a `Struct` named with `as` is generated).
#[macro_export]
macro_rules! guest_protocol {
    (
        requests {
            $(
                $(#[$rmeta:meta])*
                $rkind:literal => $req:ident
                    $( ( $rty:ty ) )?
                    $( { $( $(#[$rfmeta:meta])* $rfield:ident : $rfty:ty ),* $(,)? } )?
                    -> $answer:ty
                    $( , $rpayload:ident )? ;
            )*
        }
        responses {
            $(
                $(#[$ameta:meta])*
                $akind:literal => $resp:ident
                    $( ( $aty:ty ) )?
                    $( { $( $(#[$afmeta:meta])* $afield:ident : $afty:ty ),* $(,)? } as $asty:ident )?
                    $( , $apayload:ident )? ;
            )*
        }
    ) => {
        /// A request from a host-side client.
        #[derive(Debug, Clone, PartialEq, Eq, ::serde::Serialize, ::serde::Deserialize)]
        #[serde(tag = "kind")]
        pub enum Request {
            $(
                $(#[$rmeta])*
                #[serde(rename = $rkind)]
                $req $( ( $rty ) )? $( { $( $(#[$rfmeta])* $rfield : $rfty ),* } )? ,
            )*
        }

        impl Request {
            /// The `kind` tags this version understands.
            pub const KINDS: &'static [&'static str] = &[ $( $rkind ),* ];

            /// This request's `kind` tag.
            pub fn kind(&self) -> &'static str {
                match self {
                    $( Self::$req { .. } => $rkind, )*
                }
            }

            /// Whether this request may carry a binary payload.
            pub fn payload_allowed(&self) -> bool {
                match self {
                    $( Self::$req { .. } => $crate::guest_protocol!(@payload $($rpayload)?), )*
                }
            }
        }

        impl $crate::frame::Message for Request {
            const KINDS: &'static [&'static str] = Request::KINDS;
            fn payload_allowed(&self) -> bool {
                Request::payload_allowed(self)
            }
            fn kind(&self) -> &'static str {
                Request::kind(self)
            }
        }

        /// A response from the supervisor.
        #[derive(Debug, Clone, PartialEq, ::serde::Serialize, ::serde::Deserialize)]
        #[serde(tag = "kind")]
        pub enum Response {
            $(
                $(#[$ameta])*
                #[serde(rename = $akind)]
                $resp $( ( $aty ) )? $( { $( $(#[$afmeta])* $afield : $afty ),* } )? ,
            )*
            /// The request could not be served.
            #[serde(rename = "error")]
            Error {
                /// Stable code, e.g. `bad_frame`, `not_ready`.
                code: String,
                /// For people.
                message: String,
            },
        }

        impl Response {
            /// The `kind` tags this version understands.
            pub const KINDS: &'static [&'static str] = &[ $( $akind, )* "error" ];

            /// This response's `kind` tag.
            pub fn kind(&self) -> &'static str {
                match self {
                    $( Self::$resp { .. } => $akind, )*
                    Self::Error { .. } => "error",
                }
            }

            /// Whether this response may carry a binary payload.
            pub fn payload_allowed(&self) -> bool {
                match self {
                    $( Self::$resp { .. } => $crate::guest_protocol!(@payload $($apayload)?), )*
                    Self::Error { .. } => false,
                }
            }

            /// An error response.
            pub fn error(code: impl Into<String>, message: impl Into<String>) -> Self {
                Self::Error {
                    code: code.into(),
                    message: message.into(),
                }
            }
        }

        impl $crate::frame::Message for Response {
            const KINDS: &'static [&'static str] = Response::KINDS;
            fn payload_allowed(&self) -> bool {
                Response::payload_allowed(self)
            }
            fn kind(&self) -> &'static str {
                Response::kind(self)
            }
        }

        $(
            $crate::guest_protocol!(@answer $akind, $resp
                $( ( $aty ) )?
                $( { $( $(#[$afmeta])* $afield : $afty ),* } as $asty )?);
        )*

        /// One typed call per [`Request`] variant: send it with
        /// `Request::from(call)`, expect its [`Call::Answer`](crate::Call::Answer).
        pub mod call {
            #[allow(unused_imports)]
            use super::*;
            $(
                $crate::guest_protocol!(@call $(#[$rmeta])* $req $( ( $rty ) )?
                    $( { $( $(#[$rfmeta])* $rfield : $rfty ),* } )?);
            )*
        }

        $(
            $crate::guest_protocol!(@call_impl $rkind, $req $( ( $rty ) )? $( { $( $rfield ),* } )? -> $answer);
        )*
    };

    (@payload) => { false };
    (@payload payload) => { true };

    (@answer $akind:literal, $resp:ident ( $aty:ty )) => {
        impl $crate::Answer for $aty {
            const KIND: &'static str = $akind;
            fn from_response(response: Response) -> Result<Self, Response> {
                match response {
                    Response::$resp(answer) => Ok(answer),
                    other => Err(other),
                }
            }
            fn into_response(self) -> Response {
                Response::$resp(self)
            }
        }
    };
    (@answer $akind:literal, $resp:ident
        { $( $(#[$afmeta:meta])* $afield:ident : $afty:ty ),* } as $asty:ident) => {
        #[doc = concat!("The content of a `", $akind, "` response.")]
        #[derive(Debug, Clone, PartialEq)]
        pub struct $asty {
            $( $(#[$afmeta])* pub $afield : $afty ),*
        }
        impl $crate::Answer for $asty {
            const KIND: &'static str = $akind;
            fn from_response(response: Response) -> Result<Self, Response> {
                match response {
                    Response::$resp { $( $afield ),* } => Ok($asty { $( $afield ),* }),
                    other => Err(other),
                }
            }
            fn into_response(self) -> Response {
                let $asty { $( $afield ),* } = self;
                Response::$resp { $( $afield ),* }
            }
        }
    };

    (@call $(#[$rmeta:meta])* $req:ident) => {
        $(#[$rmeta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        pub struct $req;
    };
    (@call $(#[$rmeta:meta])* $req:ident ( $rty:ty )) => {
        $(#[$rmeta])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $req(pub $rty);
    };
    (@call $(#[$rmeta:meta])* $req:ident
        { $( $(#[$rfmeta:meta])* $rfield:ident : $rfty:ty ),* }) => {
        $(#[$rmeta])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $req {
            $( $(#[$rfmeta])* pub $rfield : $rfty ),*
        }
    };

    (@call_impl $rkind:literal, $req:ident -> $answer:ty) => {
        impl From<call::$req> for Request {
            fn from(_: call::$req) -> Self {
                Request::$req
            }
        }
        impl $crate::Call for call::$req {
            const KIND: &'static str = $rkind;
            type Answer = $answer;
        }
    };
    (@call_impl $rkind:literal, $req:ident ( $rty:ty ) -> $answer:ty) => {
        impl From<call::$req> for Request {
            fn from(call: call::$req) -> Self {
                Request::$req(call.0)
            }
        }
        impl $crate::Call for call::$req {
            const KIND: &'static str = $rkind;
            type Answer = $answer;
        }
    };
    (@call_impl $rkind:literal, $req:ident { $( $rfield:ident ),* } -> $answer:ty) => {
        impl From<call::$req> for Request {
            fn from(call: call::$req) -> Self {
                let call::$req { $( $rfield ),* } = call;
                Request::$req { $( $rfield ),* }
            }
        }
        impl $crate::Call for call::$req {
            const KIND: &'static str = $rkind;
            type Answer = $answer;
        }
    };
}
