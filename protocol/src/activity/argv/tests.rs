//! Every form the redactor knows, as an argument and inside `sh -c`.

use super::*;

const SECRET: &str = "s3cr3tVALUE";

fn args(argv: &[&str]) -> Vec<String> {
    argv.iter().map(|s| (*s).to_owned()).collect()
}

fn redacted(argv: &[&str]) -> Vec<String> {
    redact_argv(&args(argv))
}

/// `argv` keeps no trace of [`SECRET`] and holds `[redacted]`.
fn clean(argv: &[&str]) -> Vec<String> {
    let out = redacted(argv);
    let joined = out.join(" ");
    assert!(
        !joined.contains(SECRET),
        "{argv:?} kept its secret: {out:?}"
    );
    assert!(joined.contains(REDACTED), "{argv:?} → {out:?}");
    out
}

/// `script` run as `sh -c` keeps no trace of [`SECRET`].
fn clean_script(script: &str) -> String {
    let out = clean(&["sh", "-c", script]);
    assert_eq!(out[..2], args(&["sh", "-c"]));
    out[2].clone()
}

#[test]
fn header_values_after_dash_h() {
    let v = format!("Authorization: Bearer {SECRET}");
    let out = clean(&["curl", "-H", &v, "https://example.com/"]);
    assert_eq!(
        out,
        args(&[
            "curl",
            "-H",
            "Authorization: [redacted]",
            "https://example.com/"
        ])
    );
    let v = format!("Cookie: session={SECRET}");
    assert_eq!(clean(&["curl", "--header", &v])[2], "Cookie: [redacted]");
    let v = format!("authorization:token {SECRET}");
    assert_eq!(clean(&["curl", "-sSH", &v])[2], "authorization: [redacted]");
    let v = format!("X-Api-Key: {SECRET}");
    assert_eq!(clean(&["curl", "-H", &v])[2], "X-Api-Key: [redacted]");
}

#[test]
fn header_values_joined_to_the_flag() {
    let v = format!("-HAuthorization: Bearer {SECRET}");
    assert_eq!(clean(&["curl", &v])[1], "-HAuthorization: [redacted]");
    let v = format!("--header=Cookie: a={SECRET}");
    assert_eq!(clean(&["curl", &v])[1], "--header=Cookie: [redacted]");
    let v = format!("Authorization:Bearer {SECRET}");
    assert_eq!(
        clean(&["http", "example.com", &v])[2],
        "Authorization: [redacted]"
    );
}

#[test]
fn other_headers_are_kept() {
    let argv = ["curl", "-H", "Accept: application/json", "-H", "X-Trace: 7"];
    assert_eq!(redacted(&argv), args(&argv));
}

#[test]
fn secret_flags_with_their_value_apart_or_joined() {
    for flag in [
        "--password",
        "--passwd",
        "--token",
        "--secret",
        "--api-key",
        "--api_key",
        "--apikey",
        "--access-token",
        "--client-secret",
        "--auth-token",
        "--oauth2-bearer",
        "-password",
        "--pass",
    ] {
        let out = clean(&["tool", flag, SECRET, "next"]);
        assert_eq!(out, args(&["tool", flag, REDACTED, "next"]), "{flag}");
        let joined = format!("{flag}={SECRET}");
        let out = clean(&["tool", &joined, "next"]);
        assert_eq!(out, args(&["tool", &format!("{flag}={REDACTED}"), "next"]));
    }
}

#[test]
fn flags_that_take_no_secret_leave_the_next_word() {
    let argv = ["docker", "login", "--password-stdin", "registry.example"];
    assert_eq!(redacted(&argv), args(&argv));
    let argv = ["tool", "--password", "--verbose", "file"];
    assert_eq!(redacted(&argv), args(&argv));
    let argv = ["ls", "-la", "--color=auto", "/tmp"];
    assert_eq!(redacted(&argv), args(&argv));
    let argv = ["sudo", "-u", "root", "id"];
    assert_eq!(redacted(&argv), args(&argv));
}

#[test]
fn user_passwords() {
    let v = format!("alice:{SECRET}");
    assert_eq!(clean(&["curl", "-u", &v])[2], "alice:[redacted]");
    assert_eq!(clean(&["curl", "--user", &v])[2], "alice:[redacted]");
    let v = format!("-ualice:{SECRET}");
    assert_eq!(clean(&["curl", &v])[1], "-ualice:[redacted]");
}

#[test]
fn secret_assignments() {
    for key in [
        "GITHUB_TOKEN",
        "aws_secret_access_key",
        "DB_PASSWORD",
        "API_KEY",
        "MyKey",
        "token",
        "PGPASSWD",
    ] {
        let v = format!("{key}={SECRET}");
        assert_eq!(clean(&["env", &v, "make"])[1], format!("{key}={REDACTED}"));
    }
    let argv = ["env", "LANG=C.UTF-8", "HOME=/home/user", "make"];
    assert_eq!(redacted(&argv), args(&argv));
    let v = format!("TOKEN={SECRET}");
    assert_eq!(clean(&["docker", "run", "-e", &v])[3], "TOKEN=[redacted]");
    let v = format!("--env=API_KEY={SECRET}");
    assert_eq!(clean(&["docker", "run", &v])[2], "--env=API_KEY=[redacted]");
}

#[test]
fn url_user_info() {
    let v = format!("https://alice:{SECRET}@example.com/repo.git");
    assert_eq!(
        clean(&["git", "clone", &v])[2],
        "https://[redacted]@example.com/repo.git"
    );
    let v = format!("DATABASE_URL=postgres://app:{SECRET}@db:5432/app");
    assert_eq!(
        clean(&["env", &v])[1],
        "DATABASE_URL=postgres://[redacted]@db:5432/app"
    );
    let v = format!("https://example.com/x?user=a&access_token={SECRET}#top");
    assert_eq!(
        clean(&["curl", &v])[1],
        "https://example.com/x?user=a&access_token=[redacted]#top"
    );
    let argv = ["curl", "https://example.com/a@b?q=1"];
    assert_eq!(redacted(&argv), args(&argv));
}

#[test]
fn every_form_inside_a_shell_script() {
    let s = clean_script(&format!(
        "curl -fsS -H 'Authorization: Bearer {SECRET}' https://api.example.com/v1"
    ));
    assert_eq!(
        s,
        "curl -fsS -H 'Authorization: [redacted]' https://api.example.com/v1"
    );
    let s = clean_script(&format!("curl -H \"Cookie: id={SECRET}\" x"));
    assert_eq!(s, "curl -H 'Cookie: [redacted]' x");
    let s = clean_script(&format!("curl \"-HAuthorization: {SECRET}\" x"));
    assert_eq!(s, "curl '-HAuthorization: [redacted]' x");
    let s = clean_script(&format!("curl --header='Authorization: {SECRET}' x"));
    assert_eq!(s, "curl '--header=Authorization: [redacted]' x");
    let s = clean_script(&format!("mytool --password {SECRET} && echo done"));
    assert_eq!(s, "mytool --password [redacted] && echo done");
    let s = clean_script(&format!("mytool --api-key={SECRET}; ls"));
    assert_eq!(s, "mytool --api-key=[redacted]; ls");
    let s = clean_script(&format!("export GITHUB_TOKEN={SECRET}; gh pr list"));
    assert_eq!(s, "export GITHUB_TOKEN=[redacted]; gh pr list");
    let s = clean_script(&format!("AWS_SECRET_ACCESS_KEY=\"{SECRET}\" aws s3 ls"));
    assert_eq!(s, "AWS_SECRET_ACCESS_KEY=[redacted] aws s3 ls");
    let s = clean_script(&format!(
        "git push https://bot:{SECRET}@example.com/r.git main"
    ));
    assert_eq!(s, "git push https://[redacted]@example.com/r.git main");
    let s = clean_script(&format!("curl -u bot:{SECRET} x | jq ."));
    assert_eq!(s, "curl -u bot:[redacted] x | jq .");
}

#[test]
fn scripts_inside_scripts() {
    let s = clean_script(&format!(
        "bash -c \"curl -H 'Authorization: Bearer {SECRET}' x\""
    ));
    assert!(s.starts_with("bash -c "), "{s}");
    let inner = format!("sh -c 'TOKEN={SECRET} make'");
    clean(&["ssh", "host", &inner]);
}

#[test]
fn forms_in_running_text() {
    // An unclosed quote, a header in prose, a bearer in JSON.
    clean_script(&format!("curl -H 'Authorization: Bearer {SECRET}"));
    clean(&["echo", &format!("{{\"auth\": \"Bearer {SECRET}\"}}")]);
    clean(&["printf", &format!("GET / HTTP/1.1\r\nCookie: {SECRET}\r\n")]);
}

#[test]
fn what_is_redacted_stays_redacted() {
    let once = redacted(&["curl", "-H", &format!("Authorization: Bearer {SECRET}")]);
    let refs: Vec<&str> = once.iter().map(String::as_str).collect();
    assert_eq!(redacted(&refs), once);
    let script = format!("curl -u a:{SECRET} https://u:{SECRET}@h/?token={SECRET}");
    let once = redacted(&["sh", "-c", &script]);
    let refs: Vec<&str> = once.iter().map(String::as_str).collect();
    assert_eq!(redacted(&refs), once);
}

#[test]
fn argv_is_cut_to_a_kibibyte() {
    let long = "é".repeat(2000);
    let (cut, was_cut) = cut_argv(args(&["echo", &long, "after"]), MAX_ARGV_BYTES);
    assert!(was_cut);
    assert_eq!(cut.len(), 2);
    assert!(cut.iter().map(String::len).sum::<usize>() <= MAX_ARGV_BYTES);
    assert!(cut[1].ends_with('…'));
    let (same, was_cut) = cut_argv(args(&["ls", "-l"]), MAX_ARGV_BYTES);
    assert!(!was_cut);
    assert_eq!(same, args(&["ls", "-l"]));
}

#[test]
fn a_secret_past_the_cut_is_redacted_before_it() {
    let url = format!("https://{}:{SECRET}@example.com/", "u".repeat(1020));
    let given = Argv::given(args(&["git", "clone", &url]));
    let kept = given.kept(ArgvRecord::Redacted);
    let line = kept.line();
    assert!(!line.contains(SECRET) && !line.contains("uuuu"), "{line}");
}

#[test]
fn modes() {
    let secret = format!("--token={SECRET}");
    let given = Argv::given(args(&["deploy", &secret]));
    let redacted = given.kept(ArgvRecord::Redacted);
    assert_eq!(redacted.program, "deploy");
    assert_eq!(redacted.argv, Some(args(&["deploy", "--token=[redacted]"])));
    let full = given.kept(ArgvRecord::Full);
    assert_eq!(full.argv, Some(args(&["deploy", &secret])));
    let none = given.kept(ArgvRecord::None);
    assert_eq!(none.program, "deploy");
    assert_eq!(none.argv, None);
    assert_eq!(none.line(), "deploy");
    for mode in [ArgvRecord::Redacted, ArgvRecord::Full, ArgvRecord::None] {
        assert_eq!(mode.as_str().parse::<ArgvRecord>(), Ok(mode));
    }
    assert!("all".parse::<ArgvRecord>().is_err());
    assert_eq!(ArgvRecord::default(), ArgvRecord::Redacted);
}

#[test]
fn a_long_argv_is_redacted_whole_then_cut() {
    // 128 KiB (the largest exec body's argv) of forms, words and names.
    let script = format!(
        "{} {} {}",
        "authorization ".repeat(3000),
        format!("-H 'Cookie: {SECRET}' ").repeat(2000),
        "x".repeat(40_000)
    );
    let out = redacted(&["sh", "-c", &script]);
    assert!(!out.join(" ").contains(SECRET));
    let kept = Argv::given(args(&["sh", "-c", &script])).kept(ArgvRecord::Redacted);
    assert!(kept.cut && kept.line().len() <= MAX_ARGV_BYTES + 8);
}
