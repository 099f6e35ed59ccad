//! Tests of the service specs: order, waits and environment.

use super::*;

#[test]
fn the_manager_and_vnc_wait_for_x_alone_and_a_browser_for_all_but_the_taskbar() {
    use ServiceKind::*;
    for side_by_side in [WindowManager, Vnc] {
        assert!(side_by_side.waits_for(Display));
        assert!(!side_by_side.waits_for(WindowManager));
        assert!(!side_by_side.waits_for(Vnc));
        assert!(!side_by_side.waits_for(Taskbar));
    }
    // The taskbar's band is the window manager's work area: it waits for both.
    assert!(Taskbar.waits_for(Display) && Taskbar.waits_for(WindowManager));
    assert!(!Taskbar.waits_for(Vnc));
    let browser = Browser(super::Browser::Chromium);
    for earlier in [Display, WindowManager, Vnc] {
        assert!(browser.waits_for(earlier));
    }
    // Readiness does not wait for the taskbar, so neither does a browser.
    assert!(!browser.waits_for(Taskbar));
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
    // Chromium keeps its own sandbox.
    assert!(!services[3].args.iter().any(|a| a == "--no-sandbox"));
    let plain = desktop_services(&Config::default());
    assert_eq!(plain.len(), 3, "no browser or taskbar unless configured");
    let with_taskbar = desktop_services(&Config {
        taskbar: Some("/etc/dormouse/tint2rc".into()),
        ..config
    });
    let names: Vec<_> = with_taskbar.iter().map(|s| s.name).collect();
    assert_eq!(names, ["xvfb", "openbox", "vnc", "taskbar", "browser"]);
    assert_eq!(with_taskbar[3].program, "tint2");
    assert_eq!(with_taskbar[3].args, ["-c", "/etc/dormouse/tint2rc"]);
}

#[test]
fn browsers_by_name() {
    assert_eq!(Browser::from_name("Chromium"), Some(Browser::Chromium));
    assert_eq!(Browser::from_name("firefox-esr"), Some(Browser::Firefox));
    assert_eq!(Browser::from_name("lynx"), None);
}

#[test]
fn the_taskbar_band_is_what_the_work_area_leaves_below() {
    use super::readiness::band_below;
    assert_eq!(band_below(&[0, 0, 1280, 768], 800), Some(32));
    assert_eq!(band_below(&[0, 0, 1280, 800], 800), Some(0));
    // Several desktops: the first one's area counts.
    assert_eq!(
        band_below(&[0, 0, 1280, 770, 0, 0, 1280, 800], 800),
        Some(30)
    );
    assert_eq!(band_below(&[0, 0], 800), None);
    assert_eq!(band_below(&[0, 900, 1280, 900], 800), Some(0));
}
