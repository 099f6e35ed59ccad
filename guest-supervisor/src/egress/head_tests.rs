use super::*;
use std::time::Duration;
use tokio::io::AsyncWriteExt as _;

fn status(head: &str) -> u16 {
    match parse(head.as_bytes()) {
        Ok(r) => panic!("{head:?} accepted as {r:?}"),
        Err(e) => {
            assert!(!e.reason.chars().any(char::is_control), "{e:?}");
            e.status
        }
    }
}

#[test]
fn connect_names_host_and_port() {
    let r = parse(b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n").unwrap();
    assert_eq!(
        (r.host.as_str(), r.port, &r.form),
        ("pypi.org", 443, &EgressForm::Connect)
    );
    assert!(r.upstream_head.is_empty());
    let r = parse(b"CONNECT [2001:DB8::1]:22 HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!((r.host.as_str(), r.port), ("2001:db8::1", 22));
    let r = parse(b"CONNECT Example.COM.:8443 HTTP/1.0\r\n\r\n").unwrap();
    assert_eq!((r.host.as_str(), r.port), ("example.com", 8443));
    let r = parse(b"CONNECT 203.0.113.7:443 HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!(r.host, "203.0.113.7");
}

#[test]
fn plain_http_is_rewritten_to_origin_form() {
    let head = b"GET http://TestSite.invalid:8080/a/b?c=d HTTP/1.1\r\n\
        Host: elsewhere\r\nUser-Agent: curl/7.88\r\nProxy-Connection: Keep-Alive\r\n\
        Proxy-Authorization: Basic eA==\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\n\
        Keep-Alive: 5\r\nAccept: */*\r\nContent-Length: 3\r\n\r\n";
    let r = parse(head).unwrap();
    assert_eq!((r.host.as_str(), r.port), ("testsite.invalid", 8080));
    assert_eq!(
        r.form,
        EgressForm::Http {
            method: "GET".into()
        }
    );
    let up = String::from_utf8(r.upstream_head).unwrap();
    assert_eq!(
        up,
        "GET /a/b?c=d HTTP/1.1\r\nHost: TestSite.invalid:8080\r\nUser-Agent: curl/7.88\r\n\
         Accept: */*\r\nContent-Length: 3\r\nConnection: close\r\n\r\n"
    );
    let r = parse(b"POST http://a.b HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!(r.port, 80);
    assert!(r
        .upstream_head
        .starts_with(b"POST / HTTP/1.1\r\nHost: a.b\r\n"));
    let r = parse(b"GET http://a.b?x HTTP/1.1\r\n\r\n").unwrap();
    assert!(r.upstream_head.starts_with(b"GET /?x HTTP/1.1\r\n"));
    let r = parse(b"GET http://[::1]:81/ HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!((r.host.as_str(), r.port), ("::1", 81));
}

#[test]
fn ports_outside_1_to_65535_are_refused() {
    for target in [
        "a.b:0",
        "a.b:70000",
        "a.b:",
        "a.b:-1",
        "a.b:+80",
        "a.b:0x50",
        "a.b:123456",
        "a.b",
    ] {
        assert_eq!(
            status(&format!("CONNECT {target} HTTP/1.1\r\n\r\n")),
            400,
            "{target}"
        );
    }
    assert_eq!(status("GET http://a.b:0/ HTTP/1.1\r\n\r\n"), 400);
    assert_eq!(status("GET http://a.b:70000/ HTTP/1.1\r\n\r\n"), 400);
    let e = parse(b"CONNECT a.b:70000 HTTP/1.1\r\n\r\n").unwrap_err();
    assert!(e.reason.contains("invalid port \"70000\""), "{e:?}");
}

#[test]
fn hostile_names_are_refused() {
    for target in [
        "evil\u{1}.com:443",
        "evil\u{7f}.com:443",
        "a\u{1b}[2J.com:443",
        "under score!.com:443",
        "a/b:443",
        "user@a.b:443",
        "[::1:443",
        "[not-v6]:443",
        "::1:443",
        "[::1]x:443",
        ":443",
        "1.2.3:443",
    ] {
        assert_eq!(
            status(&format!("CONNECT {target} HTTP/1.1\r\n\r\n")),
            400,
            "{target:?}"
        );
    }
    let long = format!("CONNECT {}.com:443 HTTP/1.1\r\n\r\n", "a.".repeat(130));
    assert_eq!(status(&long), 400);
    assert_eq!(status("GET http://us:pw@a.b/ HTTP/1.1\r\n\r\n"), 400);
    assert_eq!(status("GET http://a\u{0}b/ HTTP/1.1\r\n\r\n"), 400);
}

#[test]
fn other_forms_and_methods_are_refused_with_a_reason() {
    assert_eq!(status("GET / HTTP/1.1\r\nHost: a.b\r\n\r\n"), 400);
    assert!(parse(b"GET / HTTP/1.1\r\n\r\n")
        .unwrap_err()
        .reason
        .contains("absolute URL"));
    assert_eq!(status("GET https://a.b/ HTTP/1.1\r\n\r\n"), 400);
    assert_eq!(status("GET ftp://a.b/ HTTP/1.1\r\n\r\n"), 400);
    assert_eq!(status("TRACE http://a.b/ HTTP/1.1\r\n\r\n"), 405);
    assert_eq!(status("trace http://a.b/ HTTP/1.1\r\n\r\n"), 405);
    // Found by fuzzing (egress_head): the guest took `connect` as a plain
    // HTTP method that the broker then refused.
    assert_eq!(status("connect http://a.b/ HTTP/1.1\r\n\r\n"), 405);
    assert_eq!(status("Connect a.b:443 HTTP/1.1\r\n\r\n"), 405);
    assert_eq!(status("GET http://a.b/ HTTP/2.0\r\n\r\n"), 400);
    assert_eq!(status("GET http://a.b/\r\n\r\n"), 400);
    assert_eq!(status("GET  http://a.b/ HTTP/1.1\r\n\r\n"), 400);
    assert_eq!(status("G(T http://a.b/ HTTP/1.1\r\n\r\n"), 400);
    assert_eq!(status("\r\n\r\n"), 400);
    assert_eq!(
        status("GET http://a.b/ HTTP/1.1\r\nNo colon here\r\n\r\n"),
        400
    );
    assert_eq!(
        status("GET http://a.b/ HTTP/1.1\r\nA: b\r\n folded\r\n\r\n"),
        400
    );
    assert_eq!(
        status("GET http://a.b/ HTTP/1.1\r\nBad Name: b\r\n\r\n"),
        400
    );
    assert_eq!(
        status("GET http://a.b/ HTTP/1.1\r\nA: b\u{1b}c\r\n\r\n"),
        400
    );
    assert!(parse(b"GET http://a.b/ HTTP/1.1\r\nA: \xff\r\n\r\n").is_err());
}

fn far_deadline() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

#[tokio::test]
async fn the_head_and_the_bytes_after_it_are_split() {
    let (mut a, mut b) = tokio::io::duplex(1 << 16);
    a.write_all(b"CONNECT a.b:443 HTTP/1.1\r\n\r\n\x16\x03\x01")
        .await
        .unwrap();
    let (head, early) = read_head(&mut b, far_deadline()).await.unwrap();
    assert_eq!(head, b"CONNECT a.b:443 HTTP/1.1\r\n\r\n");
    assert_eq!(early, b"\x16\x03\x01");
    // A head split across reads, its end marker too.
    let (mut a, mut b) = tokio::io::duplex(1 << 16);
    let reader = tokio::spawn(async move { read_head(&mut b, far_deadline()).await });
    for part in [
        &b"GET http://a.b/ HTTP/1.1\r"[..],
        b"\nA: b\r\n\r",
        b"\nbody",
    ] {
        a.write_all(part).await.unwrap();
        tokio::task::yield_now().await;
    }
    let (head, early) = reader.await.unwrap().unwrap();
    assert!(head.ends_with(b"A: b\r\n\r\n"));
    assert_eq!(early, b"body");
}

#[tokio::test]
async fn a_mebibyte_request_line_is_cut_off_early() {
    let (mut a, mut b) = tokio::io::duplex(1 << 20);
    let writer = tokio::spawn(async move {
        let mut line = b"GET http://a.b/".to_vec();
        line.extend(std::iter::repeat_n(b'x', 1 << 20));
        // The reader stops long before the end: the write may then fail.
        let _ = a.write_all(&line).await;
    });
    let err = read_head(&mut b, far_deadline()).await.unwrap_err();
    assert_eq!(err.status, 400, "{err:?}");
    assert!(err.reason.contains("request line"), "{err:?}");
    drop(b);
    writer.await.unwrap();
}

#[tokio::test]
async fn a_head_over_32_kib_is_431() {
    let (mut a, mut b) = tokio::io::duplex(1 << 20);
    let mut head = b"GET http://a.b/ HTTP/1.1\r\n".to_vec();
    while head.len() <= MAX_REQUEST_HEAD {
        head.extend_from_slice(b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
    }
    head.extend_from_slice(b"\r\n");
    a.write_all(&head).await.unwrap();
    let err = read_head(&mut b, far_deadline()).await.unwrap_err();
    assert_eq!(err.status, 431, "{err:?}");
}

#[tokio::test(start_paused = true)]
async fn slowloris_meets_one_deadline_for_the_whole_head() {
    let (mut a, mut b) = tokio::io::duplex(1 << 16);
    let started = Instant::now();
    let trickle = tokio::spawn(async move {
        for _ in 0..1000 {
            if a.write_all(b"X").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let err = read_head(&mut b, started + Duration::from_secs(10))
        .await
        .unwrap_err();
    assert_eq!(err.status, 408, "{err:?}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(10) && took < Duration::from_secs(11),
        "{took:?}"
    );
    drop(b);
    trickle.await.unwrap();
}

#[tokio::test]
async fn a_client_that_closes_early_is_a_400() {
    let (mut a, mut b) = tokio::io::duplex(1 << 16);
    a.write_all(b"GET http://a.b/ HTTP/1.1\r\n").await.unwrap();
    drop(a);
    assert_eq!(
        read_head(&mut b, far_deadline()).await.unwrap_err().status,
        400
    );
}
