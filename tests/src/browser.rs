//! The browsers of a desktop as a user meets them: a login cookie Chromium
//! keeps in its profile, a Firefox profile that must open again, and the
//! profile locks a killed browser leaves behind.
//!
//! The guest has no network and no python or curl, so the page that sets the
//! cookie is served inside the guest by a small Perl server on loopback. Both
//! browsers run headless as `desk` on the profiles the desktop itself uses
//! (`~/.config/chromium`, `~/.mozilla`), so a broken profile link or a stale
//! lock shows up here exactly as it would for the user.

use anyhow::{bail, ensure, Context, Result};
use rand::Rng;

use crate::guest::{shell_quote, tail, Guest, GuestUser};

/// Chromium's profile directory in the guest.
pub const CHROMIUM_PROFILE: &str = "/home/desk/.config/chromium";

/// A Firefox profile made by the tests, inside the desktop's `~/.mozilla`.
pub const FIREFOX_PROFILE: &str = "/home/desk/.mozilla/firefox/dormouse-e2e";

/// Name of the cookie the test page sets.
pub const COOKIE_NAME: &str = "dormouse_marker";

/// Where the cookie server script is written in the guest.
const COOKIE_SERVER_PATH: &str = "/tmp/dormouse-cookie-server.pl";

/// An HTTP server of two pages on 127.0.0.1: `/set` answers with a
/// persistent cookie (one year), every other path echoes the `Cookie` header
/// it received. Arguments: port, cookie value. Writes `listening` to stdout
/// once it accepts connections.
const COOKIE_SERVER: &str = r#"use strict; use warnings; use IO::Socket::INET;
$| = 1;
my ($port, $value) = @ARGV;
my $server = IO::Socket::INET->new(LocalAddr => "127.0.0.1", LocalPort => $port,
    Listen => 16, ReuseAddr => 1) or die "listen on $port: $!";
print "listening\n";
while (my $client = $server->accept) {
    my ($request, $cookie) = ("", "");
    while (my $line = <$client>) {
        $request = $line if $request eq "";
        $cookie = $1 if $line =~ /^Cookie:\s*(.*?)\r?\n?$/i;
        last if $line =~ /^\r?\n?$/;
    }
    my ($path) = $request =~ m{^GET (\S+)};
    $path = "" unless defined $path;
    my ($headers, $body) = ("", "");
    if ($path eq "/set") {
        $headers = "Set-Cookie: dormouse_marker=$value; Max-Age=31536000; Path=/\r\n";
        $body = "<html><body>cookie set</body></html>";
    } else {
        $body = "<html><body>cookie=[$cookie]</body></html>";
    }
    print $client "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n${headers}Content-Length: "
        . length($body) . "\r\nConnection: close\r\n\r\n$body";
    close $client;
}
"#;

/// Flags that keep headless Chromium quiet, offline and on the desktop's
/// profile. `--no-sandbox`: the hardened container cannot make the user
/// namespaces Chromium's sandbox wants.
const CHROMIUM: &str = "timeout 90 chromium --headless --no-sandbox --disable-gpu --no-first-run \
     --disable-background-networking --disable-component-update --disable-sync \
     --user-data-dir=/home/desk/.config/chromium";

/// Starts the cookie server on a random loopback port; returns the port.
async fn serve_cookie_page(guest: &Guest, value: &str) -> Result<u16> {
    guest
        .sh_with_input(
            GuestUser::Desk,
            &format!("cat > {COOKIE_SERVER_PATH}"),
            COOKIE_SERVER.as_bytes(),
        )
        .await
        .context("writing the cookie server into the guest")?;
    let port: u16 = rand::thread_rng().gen_range(20_000..40_000);
    let log = format!("/tmp/dormouse-cookie-server-{port}.log");
    guest
        .sh_detached(
            GuestUser::Desk,
            &format!(
                "exec timeout 300 perl {COOKIE_SERVER_PATH} {port} {} > {log} 2>&1",
                shell_quote(value)
            ),
        )
        .await?;
    // Wait for the server's own word that it listens, not a fixed time.
    guest
        .sh_ok(
            GuestUser::Desk,
            &format!(
                "for i in $(seq 1 200); do grep -q . {log} 2>/dev/null && break; sleep 0.05; done; \
                 grep -q listening {log} && exit 0; cat {log}; exit 1"
            ),
        )
        .await
        .context("the cookie server did not come up")?;
    Ok(port)
}

/// Runs headless Chromium on the desktop's profile to load `url` and returns
/// the page's DOM. Fails with Chromium's output if it does not start.
pub async fn chromium_dump_dom(guest: &Guest, url: &str) -> Result<String> {
    let out = guest
        .sh(GuestUser::Desk, &format!("{CHROMIUM} --dump-dom {url}"))
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    ensure!(
        out.status.success() && stdout.contains("<html"),
        "Chromium did not load {url} on its profile ({}):\nstdout: {}\nstderr: {}",
        out.status,
        tail(&stdout, 1500),
        tail(&stderr, 3000)
    );
    Ok(stdout)
}

/// Logs in, as far as a browser can tell: loads a page that sets a
/// persistent cookie with `value`, and checks Chromium sends it back.
pub async fn chromium_set_cookie(guest: &Guest, value: &str) -> Result<()> {
    let port = serve_cookie_page(guest, value).await?;
    chromium_dump_dom(guest, &format!("http://127.0.0.1:{port}/set")).await?;
    let seen = chromium_cookie(guest, port).await?;
    ensure!(
        seen.contains(&format!("{COOKIE_NAME}={value}")),
        "Chromium did not keep the cookie it was just given: it sent {seen:?}"
    );
    Ok(())
}

/// The `Cookie` header Chromium sends to the page at `port`.
async fn chromium_cookie(guest: &Guest, port: u16) -> Result<String> {
    let dom = chromium_dump_dom(guest, &format!("http://127.0.0.1:{port}/get")).await?;
    let start = dom.find("cookie=[").context("no cookie echo in the page")? + "cookie=[".len();
    let end = dom[start..].find(']').context("unterminated cookie echo")? + start;
    Ok(dom[start..end].to_owned())
}

/// Checks that Chromium, started fresh on its profile, still sends the
/// cookie with `value` (a browser login that survived).
pub async fn chromium_has_cookie(guest: &Guest, value: &str) -> Result<()> {
    // The server's value does not matter for /get; it only echoes.
    let port = serve_cookie_page(guest, "unused").await?;
    let seen = chromium_cookie(guest, port).await?;
    ensure!(
        seen.contains(&format!("{COOKIE_NAME}={value}")),
        "the Chromium login cookie is gone: expected {COOKIE_NAME}={value}, Chromium sent {seen:?}"
    );
    Ok(())
}

/// Starts headless Firefox on [`FIREFOX_PROFILE`] long enough to take a
/// screenshot, and fails if it refuses the profile ("already running", a
/// lock) or produces nothing twice. A refusal fails at once; a run that
/// neither refused the profile nor wrote its screenshot is tried once more
/// (seen once in a CI run on a loaded machine: exit 1, no screenshot, no
/// word about the profile; the same test then passed three times in a row).
pub async fn firefox_opens_profile(guest: &Guest) -> Result<()> {
    let shot = "/tmp/dormouse-firefox-check.png";
    let script = format!(
        "mkdir -p {FIREFOX_PROFILE} && rm -f {shot} && \
         timeout 120 firefox-esr --headless --no-remote --profile {FIREFOX_PROFILE} \
         --screenshot {shot} about:blank 2>&1; rc=$?; \
         [ -s {shot} ] || {{ echo 'no screenshot written'; exit 1; }}; exit $rc"
    );
    let mut attempt = 1;
    loop {
        let out = guest.sh(GuestUser::Desk, &script).await?;
        let output = String::from_utf8_lossy(&out.stdout).into_owned();
        let lower = output.to_lowercase();
        let refused = lower.contains("already running") || lower.contains("is not responding");
        if out.status.success() && !refused {
            return Ok(());
        }
        if refused || attempt == 2 {
            bail!(
                "Firefox did not open its profile {FIREFOX_PROFILE} ({}, attempt {attempt}):\n{}",
                out.status,
                tail(&output, 3000)
            );
        }
        eprintln!(
            "Firefox wrote no screenshot without refusing its profile ({}); once more:\n{}",
            out.status,
            tail(&output, 600)
        );
        attempt += 1;
    }
}

/// The profile locks of browsers that were running, as seen before a kill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLocks {
    /// Target of Chromium's `SingletonLock` symlink (`<hostname>-<pid>`).
    pub chromium: String,
    /// Target of Firefox's `lock` symlink (`<ip>:+<pid>`).
    pub firefox: String,
}

/// Starts Chromium and Firefox in the background on their profiles and waits
/// until both hold their profile locks, so that a kill now leaves exactly the
/// stale locks a user's crashed session would.
pub async fn hold_profiles(guest: &Guest) -> Result<HeldLocks> {
    guest
        .sh_ok(GuestUser::Desk, &format!("mkdir -p {FIREFOX_PROFILE}"))
        .await?;
    guest
        .sh_detached(
            GuestUser::Desk,
            &format!("exec {CHROMIUM} --remote-debugging-port=0 about:blank > /tmp/dormouse-chromium-held.log 2>&1"),
        )
        .await?;
    guest
        .sh_detached(
            GuestUser::Desk,
            &format!(
                "exec firefox-esr --headless --no-remote --profile {FIREFOX_PROFILE} about:blank \
                 > /tmp/dormouse-firefox-held.log 2>&1"
            ),
        )
        .await?;
    let script = format!(
        "for i in $(seq 1 600); do \
           c=$(readlink {CHROMIUM_PROFILE}/SingletonLock); f=$(readlink {FIREFOX_PROFILE}/lock); \
           if [ -n \"$c\" ] && [ -n \"$f\" ]; then echo \"$c\"; echo \"$f\"; exit 0; fi; sleep 0.1; \
         done; echo 'browsers never took their profile locks'; \
         tail -n 20 /tmp/dormouse-chromium-held.log /tmp/dormouse-firefox-held.log; exit 1"
    );
    let out = guest.sh_ok(GuestUser::Desk, &script).await?;
    let mut lines = out.lines();
    let (Some(chromium), Some(firefox)) = (lines.next(), lines.next()) else {
        bail!("unexpected lock listing: {out:?}");
    };
    Ok(HeldLocks {
        chromium: chromium.to_owned(),
        firefox: firefox.to_owned(),
    })
}

/// The profile locks now (empty strings where there is none).
pub async fn current_locks(guest: &Guest) -> Result<HeldLocks> {
    let out = guest
        .sh_ok(
            GuestUser::Desk,
            &format!(
                "echo \"c=$(readlink {CHROMIUM_PROFILE}/SingletonLock)\"; \
                 echo \"f=$(readlink {FIREFOX_PROFILE}/lock)\""
            ),
        )
        .await?;
    let value = |prefix: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_default()
            .to_owned()
    };
    Ok(HeldLocks {
        chromium: value("c="),
        firefox: value("f="),
    })
}

/// Fails if a lock held before a kill is still there after the resume.
pub async fn ensure_stale_locks_cleared(guest: &Guest, before: &HeldLocks) -> Result<()> {
    let now = current_locks(guest).await?;
    ensure!(
        now.chromium != before.chromium,
        "Chromium's stale SingletonLock -> {} survived the container restart",
        before.chromium
    );
    ensure!(
        now.firefox != before.firefox,
        "Firefox's stale lock -> {} survived the container restart",
        before.firefox
    );
    Ok(())
}
