//! The declaration form of the guest protocol: [`guest_protocol!`] turns one
//! table of requests and responses into the [`Request`](crate::Request) and
//! [`Response`](crate::Response) enums, their `kind` tags, one typed call
//! per request ([`crate::call`]) and the answer each call expects.
//!
//! Owns the traits that tie a request to its answer ([`Call`], [`Answer`]),
//! the connection modes a request may have ([`Mode`]) and the shapes of the
//! generated service the supervisor implements ([`Reply`], [`Refusal`],
//! [`After`], [`Served`]). It must never hold message contents or policy:
//! the table itself lives in [`crate::guest`], and what a peer does with a
//! message is the peer's.

/// What a request does to its connection, declared per request in the
/// table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One answer, then the connection serves the next request.
    Answer,
    /// A stream of answers until the client hangs up (`watch`).
    Stream,
    /// Served on the connection, which then means "the caller is still
    /// there" (its end or any byte cancels or releases), no idle bound.
    Held,
    /// The connection becomes a session of frames both ways
    /// (`pty_open`) until it ends.
    Session,
}

/// A typed answer and the payload that goes with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply<A> {
    /// The answer.
    pub answer: A,
    /// Its frame's payload (empty for most answers).
    pub payload: Vec<u8>,
}

impl<A> Reply<A> {
    /// `answer` with `payload` as its frame's payload.
    pub fn with_payload(answer: A, payload: Vec<u8>) -> Self {
        Self { answer, payload }
    }
}

impl<A> From<A> for Reply<A> {
    fn from(answer: A) -> Self {
        Self {
            answer,
            payload: Vec::new(),
        }
    }
}

/// Why a request was not served: the `error` response's code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Stable code, e.g. `screenshot_failed`.
    pub code: String,
    /// For people.
    pub message: String,
}

impl Refusal {
    /// A refusal with `code` and `message`.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
        }
    }
}

/// What a request served on its connection leaves the connection to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// It may serve the next request.
    Continue,
    /// It is done; close it.
    Close,
}

/// What the generated dispatcher ([`crate::guest::serve`]) made of one
/// request.
// Returned once per request and moved straight to the writer, never kept
// in bulk: boxing the answer would add an allocation to every request.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Served {
    /// A [`Mode::Answer`] request's answer (or its refusal) and payload,
    /// for the caller to write.
    Answer(crate::Response, Vec<u8>),
    /// A request served on its connection is done with it this way.
    Done(After),
}

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
    /// Whether `payload` is what this answer says it carries: for an
    /// answer declared `payload checked`, its own `check_payload` (declared
    /// beside the table); for any other, always. A client runs it on every
    /// answer it reads, so a caller never sees a payload that breaks it.
    ///
    /// # Errors
    /// Why the payload is malformed.
    fn check(&self, payload: &[u8]) -> Result<(), &'static str>;
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
    /// What it does to its connection.
    const MODE: Mode;
}

/// Declares the guest protocol. Used once, in [`crate::guest`].
///
/// ```text
/// guest_protocol! {
///     requests {
///         /// docs
///         "kind" => Variant { field: Type, ... } -> AnswerType, answer method;
///         "kind" => Variant(Type) -> AnswerType, held method, payload;
///         // mode: answer | stream | held | session (see `Mode`);
///         // method: the `GuestService` method that serves it
///     }
///     responses {
///         /// docs
///         "kind" => Variant(Type);                                // a newtype answer
///         "kind" => Variant { field: Type, ... } as Struct;       // a struct answer
///         "kind" => Variant(Type), payload;                       // may carry a payload
///         "kind" => Variant(Type), payload checked;               // ... that `Type::check_payload` checks
///     }
/// }
/// ```
///
/// It yields `Request` and `Response` (with a fixed last `Error` variant,
/// kind `"error"`), `KINDS` and `kind()` for both, `Response::error`,
/// `payload_allowed()` for both, one struct `call::Variant` per request with
/// `impl Call` and `From<call::Variant> for Request`, and `impl Answer` for
/// every answer type (a `Struct` named with `as` is generated).
///
/// It also yields the service the supervisor implements: `GuestService`,
/// one method per request (an `answer` request's method returns its typed
/// [`Reply`] or a [`Refusal`]; the others are handed the connection and
/// return [`After`]), and `serve`, the one dispatcher from a [`Request`] to
/// its method. A request missing from an implementation does not compile.
#[macro_export]
macro_rules! guest_protocol {
    (
        requests {
            $(
                $(#[$rmeta:meta])*
                $rkind:literal => $req:ident
                    $( ( $rty:ty ) )?
                    $( { $( $(#[$rfmeta:meta])* $rfield:ident : $rfty:ty ),* $(,)? } )?
                    -> $answer:ty , $mode:ident $method:ident
                    $( , $rpayload:ident )? ;
            )*
        }
        responses {
            $(
                $(#[$ameta:meta])*
                $akind:literal => $resp:ident
                    $( ( $aty:ty ) )?
                    $( { $( $(#[$afmeta:meta])* $afield:ident : $afty:ty ),* $(,)? } as $asty:ident )?
                    $( , $apayload:ident $( $acheck:ident )? )? ;
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

            /// What this request does to its connection.
            pub fn mode(&self) -> $crate::declare::Mode {
                match self {
                    $( Self::$req { .. } => $crate::guest_protocol!(@mode $mode), )*
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
                $( { $( $(#[$afmeta])* $afield : $afty ),* } as $asty )?
                ; $( $( $acheck )? )?);
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
            $crate::guest_protocol!(@call_impl $rkind, $req $( ( $rty ) )? $( { $( $rfield ),* } )? -> $answer, $mode);
        )*

        /// The supervisor's side of the table: one method per request. An
        /// `answer` request's method returns its typed reply; a request of
        /// another mode is handed the connection ([`GuestService::Conn`])
        /// and its payload, and says what is left of the connection.
        pub trait GuestService: Sync {
            /// One client connection, as the implementation reads and
            /// writes it.
            type Conn: Send;
            $(
                $crate::guest_protocol!(@method $(#[$rmeta])* $mode $method $req -> $answer);
            )*
        }

        /// Serves one request with `service`: the table's one dispatch. An
        /// `answer` request's reply (or refusal) comes back as
        /// [`Served::Answer`](crate::declare::Served::Answer) for the caller
        /// to write (its request payload, never allowed, is dropped); any
        /// other is served on `conn`.
        pub async fn serve<S: GuestService>(
            service: &S,
            request: Request,
            payload: Vec<u8>,
            conn: &mut S::Conn,
        ) -> $crate::declare::Served {
            match request {
                $(
                    request @ Request::$req { .. } => {
                        // Always `Some`: the arm picked the kind.
                        let Some(call) = call::$req::from_request(request) else {
                            return $crate::declare::Served::Answer(
                                Response::error("bad_request", "a request of another kind"),
                                Vec::new(),
                            );
                        };
                        $crate::guest_protocol!(@serve $mode service $method call payload conn)
                    }
                )*
            }
        }
    };

    (@mode answer) => { $crate::declare::Mode::Answer };
    (@mode stream) => { $crate::declare::Mode::Stream };
    (@mode held) => { $crate::declare::Mode::Held };
    (@mode session) => { $crate::declare::Mode::Session };

    (@method $(#[$rmeta:meta])* answer $method:ident $req:ident -> $answer:ty) => {
        $(#[$rmeta])*
        fn $method(
            &self,
            call: call::$req,
        ) -> impl ::std::future::Future<
            Output = Result<$crate::declare::Reply<$answer>, $crate::declare::Refusal>,
        > + Send;
    };
    (@method $(#[$rmeta:meta])* $mode:ident $method:ident $req:ident -> $answer:ty) => {
        $(#[$rmeta])*
        fn $method(
            &self,
            call: call::$req,
            payload: Vec<u8>,
            conn: &mut Self::Conn,
        ) -> impl ::std::future::Future<Output = $crate::declare::After> + Send;
    };

    (@serve answer $service:ident $method:ident $call:ident $payload:ident $conn:ident) => {{
        drop($payload);
        let _ = &$conn;
        match $service.$method($call).await {
            Ok(reply) => $crate::declare::Served::Answer(
                $crate::Answer::into_response(reply.answer),
                reply.payload,
            ),
            Err(refusal) => $crate::declare::Served::Answer(
                Response::error(refusal.code, refusal.message),
                Vec::new(),
            ),
        }
    }};
    (@serve $mode:ident $service:ident $method:ident $call:ident $payload:ident $conn:ident) => {
        $crate::declare::Served::Done($service.$method($call, $payload, $conn).await)
    };

    (@payload) => { false };
    (@payload payload) => { true };

    (@check $this:ident $payload:ident) => {{
        let _ = ($this, $payload);
        Ok(())
    }};
    (@check $this:ident $payload:ident checked) => {
        $this.check_payload($payload)
    };

    (@answer $akind:literal, $resp:ident ( $aty:ty ) ; $( $acheck:ident )?) => {
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
            fn check(&self, payload: &[u8]) -> Result<(), &'static str> {
                $crate::guest_protocol!(@check self payload $( $acheck )?)
            }
        }
    };
    (@answer $akind:literal, $resp:ident
        { $( $(#[$afmeta:meta])* $afield:ident : $afty:ty ),* } as $asty:ident ; $( $acheck:ident )?) => {
        #[doc = concat!("The content of a `", $akind, "` response.")]
        // Serde only so the fields may carry the attributes of the
        // response's own (`#[serde(default)]`); it is the same shape.
        #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
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
            fn check(&self, payload: &[u8]) -> Result<(), &'static str> {
                $crate::guest_protocol!(@check self payload $( $acheck )?)
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
        // Serde only so the fields may carry the attributes of the
        // request's own (`#[serde(default)]`); it is the same shape.
        #[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
        pub struct $req {
            $( $(#[$rfmeta])* pub $rfield : $rfty ),*
        }
    };

    (@call_impl $rkind:literal, $req:ident -> $answer:ty, $mode:ident) => {
        impl From<call::$req> for Request {
            fn from(_: call::$req) -> Self {
                Request::$req
            }
        }
        impl call::$req {
            /// The call `request` holds, if it is of this kind.
            #[allow(dead_code)]
            fn from_request(request: Request) -> Option<Self> {
                matches!(request, Request::$req).then_some(Self)
            }
        }
        impl $crate::Call for call::$req {
            const KIND: &'static str = $rkind;
            type Answer = $answer;
            const MODE: $crate::declare::Mode = $crate::guest_protocol!(@mode $mode);
        }
    };
    (@call_impl $rkind:literal, $req:ident ( $rty:ty ) -> $answer:ty, $mode:ident) => {
        impl From<call::$req> for Request {
            fn from(call: call::$req) -> Self {
                Request::$req(call.0)
            }
        }
        impl call::$req {
            /// The call `request` holds, if it is of this kind.
            #[allow(dead_code)]
            fn from_request(request: Request) -> Option<Self> {
                match request {
                    Request::$req(inner) => Some(Self(inner)),
                    #[allow(unreachable_patterns)]
                    _ => None,
                }
            }
        }
        impl $crate::Call for call::$req {
            const KIND: &'static str = $rkind;
            type Answer = $answer;
            const MODE: $crate::declare::Mode = $crate::guest_protocol!(@mode $mode);
        }
    };
    (@call_impl $rkind:literal, $req:ident { $( $rfield:ident ),* } -> $answer:ty, $mode:ident) => {
        impl From<call::$req> for Request {
            fn from(call: call::$req) -> Self {
                let call::$req { $( $rfield ),* } = call;
                Request::$req { $( $rfield ),* }
            }
        }
        impl call::$req {
            /// The call `request` holds, if it is of this kind.
            #[allow(dead_code)]
            fn from_request(request: Request) -> Option<Self> {
                match request {
                    Request::$req { $( $rfield ),* } => Some(Self { $( $rfield ),* }),
                    #[allow(unreachable_patterns)]
                    _ => None,
                }
            }
        }
        impl $crate::Call for call::$req {
            const KIND: &'static str = $rkind;
            type Answer = $answer;
            const MODE: $crate::declare::Mode = $crate::guest_protocol!(@mode $mode);
        }
    };
}
