//! Thin entry point; the logic lives in the library.

fn main() {
    if std::env::args().nth(1).as_deref() == Some("protocol-version") {
        println!("{}", dormouse_protocol::PROTOCOL_VERSION);
        return;
    }
    eprintln!("dormouse-supervisor: not implemented yet");
    std::process::exit(1);
}
