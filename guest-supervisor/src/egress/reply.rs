//! The proxy's own answers to a guest program: the status line, a one-line
//! reason (also in an `X-Dormouse-Egress` header, which `curl -v` shows for
//! a refused `CONNECT`), and for plain HTTP refusals a small HTML page a
//! person and a model both read in a screenshot. It never relays anything.

use dormouse_protocol::frame::escape_text;

/// Longest reason put into an answer.
const MAX_REASON: usize = 300;

/// The bytes `CONNECT` clients get once the broker has dialled.
pub const CONNECT_ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

fn phrase(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        403 => "Forbidden",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

/// An answer with `reason` as its plain-text body (and an HTML page when
/// `html`), closing the connection.
pub fn answer(status: u16, reason: &str, html: bool) -> Vec<u8> {
    let reason = escape_text(reason, MAX_REASON);
    let phrase = phrase(status);
    let (content_type, body) = if html {
        let safe = html_escape(&reason);
        let page = format!(
            "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{status} {phrase}</title></head>\n\
             <body style=\"font-family:sans-serif;margin:3em\"><h1>{status} {phrase}</h1>\n\
             <p>The desktop's egress proxy did not carry this request:</p>\n\
             <pre style=\"font-size:1.3em\">{safe}</pre></body></html>\n"
        );
        ("text/html; charset=utf-8", page)
    } else {
        ("text/plain; charset=utf-8", format!("{reason}\n"))
    };
    format!(
        "HTTP/1.1 {status} {phrase}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         X-Dormouse-Egress: {reason}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn html_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_carry_the_reason_safely() {
        let text =
            String::from_utf8(answer(403, "denied: a.b:443\r\nSet-Cookie: x", false)).unwrap();
        assert!(text.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{text}");
        assert!(!text.contains("\r\nSet-Cookie"), "{text}");
        assert!(text.contains("X-Dormouse-Egress: denied: a.b:443\\r\\nSet-Cookie: x\r\n"));
        let page = String::from_utf8(answer(403, "denied: <script>", true)).unwrap();
        let (head, body) = page.split_once("\r\n\r\n").unwrap();
        assert!(
            body.contains("&lt;script&gt;") && !body.contains("<script>"),
            "{page}"
        );
        assert!(head.contains(&format!("Content-Length: {}", body.len())));
    }
}
