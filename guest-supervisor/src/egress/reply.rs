//! The proxy's own answers to a guest program: the status line, a one-line
//! reason (also in an `X-Dormouse-Egress` header, which `curl -v` shows for
//! a refused `CONNECT`), and for plain HTTP refusals a small HTML page a
//! person and a model both read in a screenshot. A refusal the policy made
//! (egress `off`, a host not in the allow list) also says what to run on the
//! host to let the desktop through ([`policy_hint`]), in the page, the
//! plain body and an `X-Dormouse-Egress-Hint` header. It never relays
//! anything.

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
    answer_with_hint(status, reason, None, html)
}

/// [`answer`], with `hint` (what a person can do about it) after the
/// reason.
pub fn answer_with_hint(status: u16, reason: &str, hint: Option<&str>, html: bool) -> Vec<u8> {
    let reason = escape_text(reason, MAX_REASON);
    let hint = hint.map(|h| escape_text(h, MAX_HINT));
    let phrase = phrase(status);
    let (content_type, body) = if html {
        let safe = html_escape(&reason);
        let advice = match &hint {
            Some(h) => format!("<p style=\"font-size:1.2em\">{}</p>\n", html_escape(h)),
            None => String::new(),
        };
        let page = format!(
            "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{status} {phrase}</title></head>\n\
             <body style=\"font-family:sans-serif;margin:3em\"><h1>{status} {phrase}</h1>\n\
             <p>The desktop's egress proxy did not carry this request:</p>\n\
             <pre style=\"font-size:1.3em\">{safe}</pre>\n{advice}</body></html>\n"
        );
        ("text/html; charset=utf-8", page)
    } else {
        let advice = hint
            .as_deref()
            .map(|h| format!("{h}\n"))
            .unwrap_or_default();
        ("text/plain; charset=utf-8", format!("{reason}\n{advice}"))
    };
    let hint_header = hint
        .as_deref()
        .map(|h| format!("X-Dormouse-Egress-Hint: {h}\r\n"))
        .unwrap_or_default();
    format!(
        "HTTP/1.1 {status} {phrase}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         X-Dormouse-Egress: {reason}\r\n{hint_header}Connection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Longest hint put into an answer.
const MAX_HINT: usize = 400;

/// How the host's CLI names this desktop: the id prefix its hostname
/// (`desk-0123abcd`, the broker's `engine::hostname`) carries, which
/// `dormouse` takes as the desktop; `NAME` when the hostname is not one.
pub fn desktop_ref(hostname: &str) -> String {
    match hostname.strip_prefix("desk-") {
        Some(id) if id.len() == 8 && id.bytes().all(|b| b.is_ascii_hexdigit()) => {
            id.to_ascii_lowercase()
        }
        _ => "NAME".to_owned(),
    }
}

/// This desktop, as [`desktop_ref`] names it.
pub fn this_desktop() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .map_or_else(|| "NAME".to_owned(), |h| desktop_ref(&h))
}

/// The allow rule that lets `host:port` through, as `dormouse egress …
/// allow` takes it (an address as a one-address CIDR); `None` when it
/// would not parse as one.
pub fn allow_rule(host: &str, port: u16) -> Option<String> {
    let rule = match host.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(a)) => format!("{a}/32:{port}"),
        Ok(std::net::IpAddr::V6(a)) => format!("{a}/128:{port}"),
        Err(_) => format!("{host}:{port}"),
    };
    rule.parse::<dormouse_protocol::egress_policy::EgressRule>()
        .ok()
        .map(|_| rule)
}

/// What to run on the host when the policy refused `host:port` for
/// `reason`: `dormouse egress DESKTOP open`, or an allow rule for just
/// this destination; `None` for a refusal no policy change lifts (a deny
/// rule, a private address, a malformed request).
pub fn policy_hint(reason: &str, desktop: &str, host: &str, port: u16) -> Option<String> {
    let off = reason.contains("egress is off");
    if !off && !reason.contains("not in the allow list") {
        return None;
    }
    let allow = allow_rule(host, port)
        .map(|rule| format!("dormouse egress {desktop} allow {rule}"))
        .unwrap_or_else(|| format!("dormouse egress {desktop} allow HOST:PORT"));
    let open = format!("dormouse egress {desktop} open");
    Some(if off {
        format!(
            "Egress is off for this desktop. To open it, run on the host: {open} \
             (or allow only this destination: {allow})"
        )
    } else {
        format!("To allow it, run on the host: {allow} (or open all public egress: {open})")
    })
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

    #[test]
    fn a_policy_refusal_says_how_to_open_egress() {
        let reason = "denied: egress is off for this desktop";
        let hint = policy_hint(reason, "0123abcd", "example.com", 80).unwrap();
        assert!(hint.contains("dormouse egress 0123abcd open"), "{hint}");
        assert!(
            hint.contains("dormouse egress 0123abcd allow example.com:80"),
            "{hint}"
        );
        let page = String::from_utf8(answer_with_hint(403, reason, Some(&hint), true)).unwrap();
        let (head, body) = page.split_once("\r\n\r\n").unwrap();
        assert!(body.contains("dormouse egress 0123abcd open"), "{page}");
        assert!(
            head.contains("X-Dormouse-Egress-Hint: Egress is off"),
            "{head}"
        );
        assert!(head.contains(&format!("Content-Length: {}", body.len())));
        let plain = String::from_utf8(answer_with_hint(403, reason, Some(&hint), false)).unwrap();
        assert!(plain.ends_with(&format!("{reason}\n{hint}\n")), "{plain}");

        let listed = "denied: example.com:443 not in the allow list";
        let hint = policy_hint(listed, "NAME", "203.0.113.7", 443).unwrap();
        assert!(hint.contains("allow 203.0.113.7/32:443"), "{hint}");
        let hint = policy_hint(listed, "NAME", "2001:db8::1", 443).unwrap();
        assert!(hint.contains("allow 2001:db8::1/128:443"), "{hint}");
        assert_eq!(
            policy_hint("denied: a.b:443 matches deny rule a.b", "x", "a.b", 443),
            None
        );
        assert_eq!(
            policy_hint("denied: 10.0.0.1 is private", "x", "10.0.0.1", 443),
            None
        );
    }

    #[test]
    fn the_desktop_is_named_by_its_hostname_s_id_prefix() {
        assert_eq!(desktop_ref("desk-0123abcd"), "0123abcd");
        assert_eq!(desktop_ref("desk-0123ABCD"), "0123abcd");
        assert_eq!(desktop_ref("desk-01; rm"), "NAME");
        assert_eq!(desktop_ref("laptop"), "NAME");
    }

    #[test]
    fn allow_rules_are_ones_the_cli_takes() {
        for (host, port) in [("pypi.org", 443), ("192.0.2.1", 80), ("::1", 8080)] {
            let rule = allow_rule(host, port).unwrap();
            assert!(
                rule.parse::<dormouse_protocol::egress_policy::EgressRule>()
                    .is_ok(),
                "{rule}"
            );
        }
        assert_eq!(allow_rule("bad host", 80), None);
    }
}
