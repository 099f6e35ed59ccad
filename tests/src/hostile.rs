//! What a hostile program in a desktop does to its egress proxy, shared by
//! the end-to-end test that checks every answer and the benchmark that
//! measures another desktop's status meanwhile.

/// A Python script run in the desktop as uid 1000 with the port of a host
/// loopback server named `echo.test` as its one argument: an oversized
/// request line, control characters in a name, ports 0 and 70000, a
/// slowloris head, then a flood of up to 10 000 `CONNECT`s held open.
/// It prints one `name=value` line per probe.
pub const EGRESS_ATTACK_PY: &str = r#"
import socket, sys, time, resource, select
port = int(sys.argv[1])
def status(s, limit=15):
    s.settimeout(limit)
    got = b""
    try:
        while b"\r\n" not in got:
            b = s.recv(4096)
            if not b: break
            got += b
    except Exception:
        return "none"
    parts = got.split(b" ")
    return parts[1].decode() if len(parts) > 1 else "closed"
def probe(data, limit=15):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
    try:
        s.sendall(data)
    except Exception:
        pass
    return status(s, limit)
print("long_line=" + probe(b"GET http://echo.test:%d/" % port + b"a" * (1 << 20) + b" HTTP/1.1\r\n\r\n"))
print("control=" + probe(b"CONNECT ec\x01ho.test:%d HTTP/1.1\r\n\r\n" % port))
print("port0=" + probe(b"CONNECT echo.test:0 HTTP/1.1\r\n\r\n"))
print("port70000=" + probe(b"CONNECT echo.test:70000 HTTP/1.1\r\n\r\n"))
t = time.time()
s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
s.sendall(b"GET http://echo.test:%d/ HTTP/1.1\r\nHost: echo" % port)
print("slowloris=" + status(s, 20) + " after=%.1f" % (time.time() - t))
s.close()
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
want = min(10000, hard - 64)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
socks, refused_at_connect = [], 0
for i in range(want):
    try:
        c = socket.create_connection(("127.0.0.1", 3128), timeout=2)
        c.sendall(b"CONNECT echo.test:%d HTTP/1.1\r\n\r\n" % port)
        socks.append(c)
    except Exception:
        refused_at_connect += 1
print("opened=%d connect_failed=%d" % (len(socks), refused_at_connect))
codes = {}
deadline = time.time() + 25
pending = {c.fileno(): c for c in socks}
heads = {}
poller = select.poll()
for fd in pending:
    poller.register(fd, select.POLLIN)
while pending and time.time() < deadline:
    for fd, _ in poller.poll(500):
        c = pending.get(fd)
        if c is None:
            continue
        try:
            b = c.recv(256)
        except Exception:
            b = b""
        if b:
            heads[fd] = heads.get(fd, b"") + b
            if b"\r\n" not in heads[fd]:
                continue
            code = heads[fd].split(b" ")[1].decode()
        else:
            code = "closed"
        codes[code] = codes.get(code, 0) + 1
        del pending[fd]
        poller.unregister(fd)
codes["unanswered"] = len(pending)
print("codes=" + ",".join("%s:%d" % kv for kv in sorted(codes.items())))
for c in socks:
    c.close()
"#;
