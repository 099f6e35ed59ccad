"""The panel's dock in headless Chromium, against a real broker and desktop
(run by panel_test.py after its own checks, on the same broker).

On a stopped desktop:
  * its card shows the screen kept at its last stop, marked not live;
  * Files: a new folder, an upload (witness: the file's bytes on the host),
    a download (the bytes Chromium saved), a delete (gone on the host);
    `docker events` sees no start of the container meanwhile.
Then, started, with control taken in the panel:
  * Terminal: `echo hi-$((6*7))` typed into xterm.js prints hi-42;
  * Clipboard: text sent from the dock is what `xclip -o` reads in the
    guest, and text copied in the guest appears in the dock;
  * Activity: an action batch and a command made through the API appear in
    the list within 1 s of their answers.
Each state is saved to docs/images/ (and the evidence directory).
"""

import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from panel_test import REPO, chromium_driver, log, wait_for

DOCS_IMAGES = REPO / "docs" / "images"
# The activity list must show an entry this soon after the API answered.
ACTIVITY_WITHIN_S = 1.0


def save(driver, evidence, name, dock=True):
    if dock:
        # The dock whole in the picture, the card above it as far as fits.
        driver.execute_script("document.getElementById('dock').scrollIntoView({block: 'end'})")
        time.sleep(0.3)
    path = evidence / name
    driver.save_screenshot(str(path))
    DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, DOCS_IMAGES / name)
    log(f"dock: saved {name}")


def guest(cid, *argv, user="1000:1000"):
    return subprocess.run(["docker", "exec", "-u", user, "-e", "DISPLAY=:1", f"dormouse-{cid}", *argv],
                          capture_output=True, text=True, timeout=30)


class Events:
    """`docker events` for one container, from now until stop()."""

    def __init__(self, cid):
        self.proc = subprocess.Popen(
            ["docker", "events", "--filter", f"container=dormouse-{cid}", "--format", "{{.Status}}"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        time.sleep(0.5)  # let the subscription start before anything happens

    def stop(self):
        time.sleep(0.5)
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        return out.split()


def sign_in(driver, base, token):
    from selenium.webdriver.common.by import By

    driver.get(base + "/")
    wait_for(driver, lambda d: d.find_element(By.ID, "token").is_displayed(), "the sign-in form")
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#login-form button[type=submit]").click()


def answer_dialog(driver, text=None):
    alert = wait_for(driver, lambda d: _alert(d), "a dialog", timeout=10)
    if text is not None:
        alert.send_keys(text)
    alert.accept()


def _alert(driver):
    try:
        return driver.switch_to.alert
    except Exception:  # noqa: BLE001 - not open yet
        return None


def row(driver, name):
    """Whether the listing has a row named `name` (read in one go: the
    table is redrawn under the test)."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#files-body tr'))"
        ".some((r) => r.dataset.name === arguments[0])", name)


def click_in_row(driver, name, selector):
    """A real click on `selector` in the row named `name`, found afresh
    when a redraw replaced it meanwhile."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    for _ in range(5):
        try:
            for r in driver.find_elements(By.CSS_SELECTOR, "#files-body tr"):
                if r.get_attribute("data-name") == name:
                    r.find_element(By.CSS_SELECTOR, selector).click()
                    return
        except StaleElementReferenceException:
            pass
        time.sleep(0.2)
    raise AssertionError(f"no {selector} to click in the row {name!r}")


def run_dock(base, token, cid, api, data_dir, evidence):
    from selenium.webdriver.common.by import By

    status = api.call("GET", f"/v1/computers/{cid}")
    if status["container"] != "running" or not status["ready"]:
        api.call("POST", f"/v1/computers/{cid}/start")
        api.wait(cid, lambda s: s["ready"], "ready")
    # Something on the screen for the thumbnail the stop keeps.
    subprocess.Popen(["docker", "exec", "-u", "1000:1000", "-e", "DISPLAY=:1", f"dormouse-{cid}", "xterm",
                      "-geometry", "90x24+200+120", "-e", "sh", "-c",
                      "echo 'Work in progress, kept while the desktop is stopped'; ls -la; sleep 600"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(2)
    api.call("POST", f"/v1/computers/{cid}/stop")
    api.wait(cid, lambda s: s["container"] == "stopped", "stopped", timeout=60)
    workspace = Path(data_dir) / "computers" / cid / "workspace" if data_dir else None
    downloads = Path(tempfile.mkdtemp(prefix="dormouse-dock-dl-"))
    upload = Path(tempfile.mkdtemp(prefix="dormouse-dock-up-")) / f"notes-{uuid.uuid4().hex[:8]}.txt"
    content = f"uploaded through the panel {uuid.uuid4()}\n".encode() + bytes(range(256)) * 64
    upload.write_bytes(content)
    card = f'li[data-id="{cid}"]'
    driver = chromium_driver()
    events = Events(cid)
    try:
        driver.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
        sign_in(driver, base, token)

        # ---- the stopped card shows its last screen ------------------------
        wait_for(driver, lambda d: d.find_element(By.CSS_SELECTOR, card + " .last-note").is_displayed(),
                 "the last screen on the stopped card", timeout=30)
        img = driver.find_element(By.CSS_SELECTOR, card + " img.screenshot")
        assert img.get_attribute("data-last") == "true", "the image is the kept one"
        width = driver.execute_script("return arguments[0].naturalWidth", img)
        assert 0 < width <= 640, f"the kept thumbnail is {width} px wide"
        note = driver.find_element(By.CSS_SELECTOR, card + " .last-note").text
        assert "not live" in note, note
        log(f"dock: stopped card shows the last screen ({width} px wide): {note!r}")
        save(driver, evidence, "panel-last-screen.png", dock=False)

        # ---- files on a stopped desktop ----------------------------------------
        driver.find_element(By.CSS_SELECTOR, card + " button.open-files").click()
        wait_for(driver, lambda d: d.find_element(By.ID, "dock").is_displayed(), "the dock")
        wait_for(driver, lambda d: not d.find_element(By.ID, "files-state").text.startswith("Loading"),
                 "the workspace listing")
        driver.find_element(By.ID, "files-new-folder").click()
        answer_dialog(driver, "reports")
        wait_for(driver, lambda d: row(d, "reports"), "the new folder listed")
        if workspace:
            assert (workspace / "reports").is_dir(), "the folder is on the host"
        click_in_row(driver, "reports", "button.link")
        wait_for(driver, lambda d: "reports" in d.find_element(By.ID, "files-crumbs").text, "inside reports")
        driver.find_element(By.ID, "files-input").send_keys(str(upload))
        wait_for(driver, lambda d: row(d, upload.name), "the uploaded file listed")
        if workspace:
            on_host = workspace / "reports" / upload.name
            assert on_host.read_bytes() == content, "the host has the uploaded bytes"
        log(f"dock: uploaded {upload.name} ({len(content)} bytes) into reports/")
        save(driver, evidence, "panel-files.png")

        click_in_row(driver, upload.name, "button.download")
        saved = downloads / upload.name
        wait_for(driver, lambda d: saved.exists() and saved.read_bytes() == content,
                 "the downloaded file with the same bytes", timeout=30)
        log("dock: the download has the uploaded bytes")

        click_in_row(driver, upload.name, "button.delete")
        answer_dialog(driver)
        wait_for(driver, lambda d: not row(d, upload.name), "the deleted file gone from the list")
        if workspace:
            assert not (workspace / "reports" / upload.name).exists(), "the file is gone on the host"
        seen = events.stop()
        events = None
        assert "start" not in seen, f"the files dock started the desktop: docker events {seen}"
        status = api.call("GET", f"/v1/computers/{cid}")
        assert status["container"] == "stopped", status
        log(f"dock: folder, upload, download, delete on a stopped desktop; docker events saw {seen or 'nothing'}")

        # ---- terminal, with control -------------------------------------------------
        api.call("POST", f"/v1/computers/{cid}/start")
        api.wait(cid, lambda s: s["ready"], "ready")
        screen_state = lambda d: d.find_element(By.CSS_SELECTOR, card + " .screen-state").text
        wait_for(driver, lambda d: screen_state(d).startswith("Live"), "the live screen", timeout=60)
        driver.find_element(By.CSS_SELECTOR, card + " button.open-terminal").click()
        wait_for(driver, lambda d: d.find_element(By.ID, "terminal-take").is_displayed(),
                 "the terminal asking for control")
        driver.find_element(By.ID, "terminal-take").click()
        wait_for(driver, lambda d: screen_state(d).startswith("Control"), "control", timeout=30)
        wait_for(driver, lambda d: d.find_element(By.ID, "terminal-open").is_displayed(), "Open a shell")
        driver.find_element(By.ID, "terminal-open").click()
        wait_for(driver, lambda d: d.find_element(By.ID, "terminal-state").text.startswith("Shell open"),
                 "the shell open", timeout=30)
        from selenium.webdriver.common.action_chains import ActionChains

        # Typed as a person would: a click into the terminal, then keys.
        driver.find_element(By.CSS_SELECTOR, "#terminal .xterm").click()
        ActionChains(driver).send_keys("echo hi-$((6*7))\n").perform()
        rows = lambda d: [r.text.strip() for r in d.find_elements(
            By.CSS_SELECTOR, "#terminal .xterm-accessibility-tree > div")]
        wait_for(driver, lambda d: "hi-42" in rows(d), "hi-42 printed by the shell", timeout=30)
        log(f"dock: the terminal printed hi-42 ({[r for r in rows(driver) if r][:4]})")
        save(driver, evidence, "panel-terminal.png")

        # ---- clipboard both ways --------------------------------------------------------
        driver.find_element(By.ID, "tab-clipboard").click()
        sent = f"pasted-from-the-panel-{uuid.uuid4().hex[:8]}"
        box = driver.find_element(By.ID, "clipboard-text")
        box.clear()
        box.send_keys(sent)
        driver.find_element(By.ID, "clipboard-send").click()
        read = lambda: guest(cid, "xclip", "-o", "-selection", "clipboard").stdout
        try:
            wait_for(driver, lambda d: read() == sent, "the guest's clipboard to hold the sent text", timeout=15)
        except AssertionError:
            both = [guest(cid, "xclip", "-o", "-selection", sel) for sel in ("clipboard", "primary")]
            raise AssertionError(f"the guest's selections after the paste: "
                                 f"{[(r.returncode, r.stdout, r.stderr) for r in both]}") from None
        log(f"dock: xclip -o in the guest reads {read()!r}")
        copied = f"copied-in-the-desktop-{uuid.uuid4().hex[:8]}"
        guest(cid, "sh", "-c", f"printf %s {copied} | xclip -selection clipboard -i >/dev/null 2>&1 &")
        copied_at = time.monotonic()
        # x11vnc sends the desktop's clipboard only once it has gone 15 s
        # without a new viewer (docs/screens.md): up to that, and a margin.
        wait_for(driver, lambda d: d.find_element(By.ID, "clipboard-text").get_attribute("value") == copied,
                 "the desktop's clipboard in the dock", timeout=45)
        log(f"dock: text copied in the guest appeared in the dock after {time.monotonic() - copied_at:.1f} s")
        save(driver, evidence, "panel-clipboard.png")

        # ---- activity, live ----------------------------------------------------------------
        # The panel gives control back; an agent then acts through the API.
        driver.find_element(By.CSS_SELECTOR, card + " button.release").click()
        wait_for(driver, lambda d: screen_state(d).startswith("Live"), "view again after Release", timeout=30)
        driver.find_element(By.ID, "tab-activity").click()
        kinds = lambda d: [li.get_attribute("data-kind") for li in d.find_elements(By.CSS_SELECTOR, "#activity-list li")]
        wait_for(driver, lambda d: len(kinds(d)) > 0, "the activity list")
        before = kinds(driver)
        api.call("POST", f"/v1/computers/{cid}/actions",
                 {"actions": [{"action": "mouse_move", "coordinate": [600, 400]}, {"action": "left_click"}]})
        answered = time.monotonic()
        wait_for(driver, lambda d: kinds(d).count("actions") > before.count("actions"),
                 "the action batch in the activity list", timeout=10)
        took_actions = time.monotonic() - answered
        api.call("POST", f"/v1/computers/{cid}/exec", {"argv": ["sh", "-c", "echo from-an-agent"]})
        answered = time.monotonic()
        wait_for(driver, lambda d: kinds(d).count("exec") > before.count("exec"),
                 "the command in the activity list", timeout=10)
        took_exec = time.monotonic() - answered
        log(f"dock: activity showed the batch {took_actions * 1000:.0f} ms and the command "
            f"{took_exec * 1000:.0f} ms after their answers")
        assert took_actions <= ACTIVITY_WITHIN_S and took_exec <= ACTIVITY_WITHIN_S, \
            f"activity must appear within {ACTIVITY_WITHIN_S} s"
        save(driver, evidence, "panel-activity.png")
    finally:
        if events is not None:
            events.stop()
        driver.quit()
        # The panel's lease lapses by itself within a minute; give it back
        # now so the desktop can be removed at once.
        try:
            generation = api.call("GET", f"/v1/computers/{cid}")["generation"]
            api.call("DELETE", f"/v1/computers/{cid}/lease", headers={"Dormouse-Generation": str(generation)})
        except Exception as e:  # noqa: BLE001 - no lease is fine
            log(f"dock: no lease to give back ({e})")
        shutil.rmtree(downloads, ignore_errors=True)
        shutil.rmtree(upload.parent, ignore_errors=True)
