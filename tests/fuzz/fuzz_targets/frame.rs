//! The frame codec (`protocol/src/frame.rs`, `protocol/src/stream.rs`): one
//! byte stream read as a request and as a response by the buffer decoder,
//! the blocking reader and the async reader (in chunks), which must agree;
//! a decoded frame encodes and decodes back to itself.
#![no_main]

use std::time::Duration;

use dormouse_fuzz::{runtime, ChunkedReader};
use dormouse_protocol::frame::{self, Frame, Message};
use dormouse_protocol::stream::{self, ReadLimits, StreamError};
use dormouse_protocol::{Request, Response};
use libfuzzer_sys::fuzz_target;

fn check<M: Message + PartialEq + std::fmt::Debug + Clone>(data: &[u8], seed: &[u8]) {
    let buffered = frame::decode::<M>(data);
    let mut blocking_input = data;
    let blocking = frame::read_frame::<M>(&mut blocking_input);
    let limits = ReadLimits::new(Some(Duration::from_secs(5)), Duration::from_secs(5));
    let mut chunked = ChunkedReader::new(data, seed);
    let streamed = runtime().block_on(stream::read_frame::<M, _>(&mut chunked, &limits));

    // The blocking reader and the buffer decoder read the same first frame.
    match (&buffered, &blocking) {
        (Ok(Some((a, used))), Ok(b)) => {
            assert_eq!(a, b, "decode and read_frame disagree");
            assert!(*used <= data.len());
        }
        (Ok(Some(_)), Err(e)) => panic!("decode took a frame that read_frame refused: {e}"),
        (Err(_), Ok(_)) => panic!("read_frame took a frame that decode refused"),
        _ => {}
    }
    // The async reader, whatever the chunking, takes what the others take
    // (and refuses a payload on a message that carries none).
    match (&streamed, &blocking) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "stream::read_frame disagrees"),
        (Ok(_), Err(e)) => panic!("stream::read_frame took a frame that read_frame refused: {e}"),
        (Err(StreamError::UnexpectedPayload { .. }), Ok(b)) => {
            assert!(!b.message.payload_allowed() && !b.payload.is_empty());
        }
        (Err(e), Ok(_)) => panic!("stream::read_frame refused a frame read_frame took: {e}"),
        _ => {}
    }
    // What was decoded encodes, and decodes back to the same frame.
    if let Ok(Frame { message, payload }) = blocking {
        let bytes = frame::encode(&message, &payload)
            .unwrap_or_else(|e| panic!("a decoded {} does not encode: {e}", message.kind()));
        let again = frame::decode::<M>(&bytes)
            .unwrap_or_else(|e| panic!("a re-encoded {} does not decode: {e}", message.kind()));
        let (again, used) = again.unwrap_or_else(|| panic!("a re-encoded frame is incomplete"));
        assert_eq!(used, bytes.len());
        assert_eq!(
            again.message, message,
            "the message changed in a round trip"
        );
        assert_eq!(again.payload, payload);
    }
}

fuzz_target!(|data: &[u8]| {
    // The last byte chooses the chunking of the async reader.
    let seed = data.last().map(|b| [*b]).unwrap_or_default();
    check::<Request>(data, &seed);
    check::<Response>(data, &seed);
});
