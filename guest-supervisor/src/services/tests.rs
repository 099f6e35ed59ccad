//! Tests of the service specs: order, waits and environment.

use super::*;

#[test]
fn the_window_manager_and_vnc_wait_for_x_alone_and_a_browser_for_all() {
    use ServiceKind::*;
    for side_by_side in [WindowManager, Vnc] {
        assert!(side_by_side.waits_for(Display));
        assert!(!side_by_side.waits_for(WindowManager));
        assert!(!side_by_side.waits_for(Vnc));
    }
    let browser = Browser(super::Browser::Chromium);
    for earlier in [Display, WindowManager, Vnc] {
        assert!(browser.waits_for(earlier));
    }
    assert!(!Display.waits_for(Display));
}

#[test]
fn services_in_order_with_hardened_flags() {
    let config = Config {
        browser: Some(Browser::Chromium),
        width: 1920,
        height: 1080,
        ..Config::default()
    };
    let services = desktop_services(&config);
    let names: Vec<_> = services.iter().map(|s| s.name).collect();
    assert_eq!(names, ["xvfb", "openbox", "vnc", "browser"]);
    assert!(services[0].args.contains(&"1920x1080x24".to_owned()));
    assert!(services[0]
        .args
        .windows(2)
        .any(|w| w == ["-nolisten", "tcp"]));
    assert!(services[2].args.contains(&"-localhost".to_owned()));
    assert!(services[0]
        .args
        .windows(2)
        .any(|w| w == ["-extension", "GLX"]));
    let with_gl = desktop_services(&Config {
        glx: true,
        ..config.clone()
    });
    assert!(!with_gl[0].args.iter().any(|a| a == "GLX"));
    assert!(services[3].args.contains(&"--no-sandbox".to_owned()));
    let plain = desktop_services(&Config::default());
    assert_eq!(plain.len(), 3, "no browser unless configured");
}

#[test]
fn browsers_by_name() {
    assert_eq!(Browser::from_name("Chromium"), Some(Browser::Chromium));
    assert_eq!(Browser::from_name("firefox-esr"), Some(Browser::Firefox));
    assert_eq!(Browser::from_name("lynx"), None);
}
