#!/usr/bin/env python3
"""Browser tests for the web client and the share page (issue 15).

Drives headless Debian Chromium (Selenium + chromedriver) against a real `lattice serve` on 127.0.0.1
with the package's Web/ directory, and the `lattice` CLI for alice. Run through Scripts/browser-tests.sh,
which installs what is missing. Every wait is bounded; a failure prints what was on the page.

Environment: LATTICE_BIN (the lattice binary), LATTICE_WEB (the Web/ folder), SCREENSHOTS (a folder for
the PNG screenshots, e.g. Docs/images), KEEP (keep the temporary folder).

Arguments: `-k TEXT` (repeatable) runs only the tests whose name contains TEXT (case-insensitive). The
first tests form a chain (each uses what the one before left); a chosen chain test runs with the chain
tests before it. The later tests stand alone.
"""
import argparse
import json
import os
import urllib.parse
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import (ElementNotInteractableException, NoAlertPresentException,
                                        StaleElementReferenceException, TimeoutException)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select
from selenium.webdriver.support.ui import WebDriverWait

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LATTICE = os.environ.get("LATTICE_BIN", os.path.join(ROOT, ".build", "debug", "lattice"))
WEB = os.environ.get("LATTICE_WEB", os.path.join(ROOT, "Web"))
SCREENSHOTS = os.environ.get("SCREENSHOTS", os.path.join(ROOT, "Docs", "images"))
XSS_ITEM = "<img src=x onerror=alert(1)>"
XSS_TITLE = "</script><script>alert(2)</script> Party"
WAIT = 10  # seconds for anything that should happen "within a few seconds"


class Failure(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)


class Server:
    """`lattice serve` on 127.0.0.1 with the web pages; `extra` adds flags (a port, a public URL, providers)."""

    def __init__(self, directory, extra=(), port=0):
        env = dict(os.environ, LATTICE_WEB_ROOT=WEB)
        self.log = open(os.path.join(directory, "server.log"), "wb")
        self.process = subprocess.Popen([LATTICE, "serve", "--data", os.path.join(directory, "data"), "--port", str(port),
                                         # more than the default 5 sign-ups from 127.0.0.1 (every person here)
                                         "--signup-per-address", "0", *extra],
                                        stdout=subprocess.PIPE, stderr=self.log, env=env)
        line = self.process.stdout.readline().decode()
        check(line.startswith("listening on "), f"lattice serve said {line!r}")
        self.url = line.split()[2].rstrip("/")
        # Keep draining stdout so the server never blocks on a full pipe.
        threading.Thread(target=lambda: [None for _ in self.process.stdout], daemon=True).start()

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


class CLI:
    def __init__(self, home):
        self.env = dict(os.environ, LATTICE_HOME=home)

    def run(self, *arguments):
        done = subprocess.run([LATTICE, *arguments], capture_output=True, text=True, env=self.env, timeout=60)
        if done.returncode != 0:
            raise Failure(f"lattice {' '.join(arguments)} failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def json(self, *arguments):
        return json.loads(self.run(*arguments, "--json"))


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for argument in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1100,900",
                     "--disable-gpu", "--no-first-run", "--disable-extensions"]:
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(shutil.which("chromedriver") or "/usr/bin/chromedriver")
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    return driver


def run_suite(label, tests):
    """Runs (name, function) pairs in order, printing ok or FAIL for each; returns the list of outcomes."""
    results = []
    for name, body in tests:
        begin = time.monotonic()
        try:
            body()
            results.append(True)
            print(f"ok   {label}: {name} ({time.monotonic() - begin:.1f} s)")
        except Exception as error:  # noqa: BLE001 - report and go on
            results.append(False)
            print(f"FAIL {label}: {name}: {error}")
    return results


def wait_for(driver, condition, message, timeout=WAIT):
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1,
                             ignored_exceptions=[StaleElementReferenceException]).until(lambda d: condition(d))
    except TimeoutException:
        raise Failure(f"{message} (after {timeout} s; page {driver.current_url}: {page_text(driver)[:600]!r})")


def page_text(driver):
    try:
        return driver.find_element(By.TAG_NAME, "body").text
    except Exception:
        return ""


def console_problems(driver, ignore=()):
    """SEVERE console entries (script errors, CSP violations, failed loads), minus expected refusals."""
    entries = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    return [e["message"] for e in entries if not any(text in e["message"] for text in ignore)]


def no_dialog(driver):
    try:
        alert = driver.switch_to.alert
        text = alert.text
        alert.dismiss()
        raise Failure(f"a dialog opened: {text!r}")
    except NoAlertPresentException:
        pass


def items_on_page(driver):
    """[(text, done, sorted tags)] of the open list, as shown."""
    return driver.execute_script("""
        return [...document.querySelectorAll('#items li.item')].map((li) => [
          li.querySelector('label.text').textContent,
          li.querySelector('input[type=checkbox]').checked,
          [...li.querySelectorAll('.tag > span:first-child')].map((t) => t.textContent.replace(/^#/, '')).sort(),
        ]);""")


def items_in_cli(cli, title):
    cli.run("sync")
    shown = cli.json("list", "show", title)
    return [[i["text"], i["done"], sorted(i["tags"])] for i in shown["items"]]


def headers(url, accept="text/html"):
    request = urllib.request.Request(url, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode()


def screenshot(driver, name):
    os.makedirs(SCREENSHOTS, exist_ok=True)
    path = os.path.join(SCREENSHOTS, name)
    driver.save_screenshot(path)
    print(f"  screenshot {os.path.relpath(path, ROOT)}")


def save_recovery_codes(driver):
    """After a sign-up the page shows ten recovery codes once: tick 'I saved these codes', Continue."""
    wait_for(driver, lambda d: d.find_elements(By.ID, "recovery-continue"), "the recovery codes after sign-up")
    check(len(driver.find_elements(By.CSS_SELECTOR, "#recovery-code-list code")) == 10, "ten recovery codes")
    driver.find_element(By.ID, "recovery-saved").click()
    driver.find_element(By.ID, "recovery-continue").click()


def sign_up_through(driver, share_url, name):
    """Opens a share link signed out, signs up from it (without a passkey: this browser has no
    authenticator; passkey_tests.py has the passkey sign-ups) and comes back to it, then joins."""
    driver.get(share_url)
    wait_for(driver, lambda d: d.find_elements(By.LINK_TEXT, "Sign up to join"), "the share page offers sign-up")
    driver.find_element(By.LINK_TEXT, "Sign up to join").click()
    field = wait_for(driver, lambda d: d.find_element(By.ID, "signup-name"), "the sign-up page")
    field.send_keys(name)
    driver.find_element(By.CSS_SELECTOR, "#signup-form button[type=submit]").click()
    save_recovery_codes(driver)
    wait_for(driver, lambda d: "/share/" in d.current_url and d.find_elements(By.ID, "join"),
             f"{name} is back on the same share page with a Join button")
    check(driver.current_url == share_url, f"came back to {driver.current_url}, not the link")
    driver.find_element(By.ID, "join").click()
    wait_for(driver, lambda d: d.execute_script("return document.body.dataset.ready") == "true"
             and d.find_elements(By.CSS_SELECTOR, "#items li.item"), f"{name} sees the list's items after joining")


def act(action, tries=50):
    """Runs an interaction again when a live update replaced the element it found (bounded). Typing uses
    `type_into`, which starts from an empty field, so a retried one does not type twice."""
    for attempt in range(tries):
        try:
            return action()
        except (StaleElementReferenceException, ElementNotInteractableException):
            if attempt == tries - 1:
                raise
            time.sleep(0.05)


def type_into(driver, element_id, text):
    """Types into a field (found by id) from empty; retried if a live update replaces the field meanwhile."""
    def once():
        field = driver.find_element(By.ID, element_id)
        field.clear()
        field.send_keys(text)
    act(once)


def open_list(driver, title):
    act(lambda: open_list_once(driver, title))


def open_list_once(driver, title):
    def find(d):
        for button in d.find_elements(By.CSS_SELECTOR, "#lists .list-link"):
            if button.find_element(By.CSS_SELECTOR, ".title").text == title:
                return button
        return None
    wait_for(driver, find, f"the list {title!r} is in the sidebar").click()
    wait_for(driver, lambda d: d.find_element(By.ID, "list-title").text == title, f"{title!r} is open")


def item_row(driver, text):
    for row in driver.find_elements(By.CSS_SELECTOR, "#items li.item"):
        if row.find_element(By.CSS_SELECTOR, "label.text").text == text:
            return row
    raise Failure(f"no item {text!r} on the page: {items_on_page(driver)}")


# MARK: Keyboard, focus and accessibility helpers

def luminance(rgb):
    """WCAG 2 relative luminance of an sRGB colour given as 0-255 components."""
    def channel(value):
        c = value / 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (channel(v) for v in rgb[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(foreground, background):
    """WCAG 2 contrast ratio of two opaque colours: (L1 + 0.05) / (L2 + 0.05), L1 the lighter."""
    a, b = luminance(foreground), luminance(background)
    return (max(a, b) + 0.05) / (min(a, b) + 0.05)


def over(top, bottom):
    """An RGBA colour (alpha 0-1) composited over an opaque one."""
    alpha = top[3] if len(top) > 3 else 1.0
    return [top[i] * alpha + bottom[i] * (1 - alpha) for i in range(3)]


# Colours as the page computes them: a colour string parsed by a canvas-free route (computed styles are
# always rgb()/rgba() in Chromium), and the opaque background behind an element (its ancestors'
# backgrounds composited from the root down, over white).
PAGE_COLOURS_JS = r"""
window.__latticeColours = window.__latticeColours || (() => {
  const parse = (text) => {
    const m = /rgba?\(([^)]+)\)/.exec(text || '');
    if (!m) return [0, 0, 0, 0];
    const parts = m[1].split(/[ ,\/]+/).filter(Boolean).map(Number);
    return [parts[0], parts[1], parts[2], parts.length > 3 ? parts[3] : 1];
  };
  const over = (top, bottom) => [0, 1, 2].map((i) => top[i] * top[3] + bottom[i] * (1 - top[3])).concat([1]);
  const background = (element) => {
    const chain = [];
    for (let n = element; n; n = n.parentElement) chain.unshift(n);
    let colour = [255, 255, 255, 1];
    for (const n of chain) {
      const style = getComputedStyle(n);
      const own = parse(style.backgroundColor);
      own[3] *= Number(style.opacity);
      colour = over(own, colour);
    }
    return colour;
  };
  const opacity = (element) => {
    let value = 1;
    for (let n = element; n; n = n.parentElement) value *= Number(getComputedStyle(n).opacity);
    return value;
  };
  return { parse, background, opacity };
})();
"""

FOCUS_JS = PAGE_COLOURS_JS + r"""
const e = document.activeElement;
if (!e || e === document.body || e === document.documentElement) return null;
const style = getComputedStyle(e);
const c = window.__latticeColours;
return { id: e.id, tag: e.tagName.toLowerCase(), type: e.getAttribute('type') || '',
         name: (e.getAttribute('aria-label') || e.textContent || '').trim().slice(0, 60),
         outlineStyle: style.outlineStyle, outlineWidth: parseFloat(style.outlineWidth) || 0,
         outlineColour: c.parse(style.outlineColor), ring: e.parentElement ? c.background(e.parentElement) : [255, 255, 255, 1],
         focusVisible: e.matches(':focus-visible'), checked: !!e.checked };
"""


def focused(driver):
    return driver.execute_script(FOCUS_JS)


def check_focus_visible(info):
    """The focused control shows a ring: :focus-visible, an outline of 2 px or more, 3:1 against what is behind it."""
    check(info is not None, "nothing is focused")
    label = f"{info['tag']}#{info['id'] or '?'} {info['name']!r}"
    check(info["focusVisible"], f"{label} is focused but not :focus-visible")
    check(info["outlineStyle"] not in ("none", "hidden") and info["outlineWidth"] >= 2,
          f"{label} has no visible focus ring ({info['outlineStyle']} {info['outlineWidth']} px)")
    ratio = contrast(over(info["outlineColour"], info["ring"]), info["ring"])
    check(ratio >= 3, f"{label}: the focus ring's contrast is {ratio:.2f}:1 (under 3:1)")


def press(driver, *keys):
    """Key presses sent to whatever has the focus (the browser's own key events, no clicks)."""
    ActionChains(driver).send_keys(*keys).perform()


def tab_to(driver, wanted, what, backwards=False, limit=40):
    """Presses Tab (Shift+Tab backwards) until the focused control satisfies `wanted`; every stop must
    show a visible focus ring. A control that already has the focus counts (no press needed)."""
    stops = []
    info = focused(driver)
    for _ in range(limit + 1):
        if info is not None and wanted(info):
            check_focus_visible(info)
            return info
        if backwards:
            ActionChains(driver).key_down(Keys.SHIFT).send_keys(Keys.TAB).key_up(Keys.SHIFT).perform()
        else:
            press(driver, Keys.TAB)
        info = focused(driver)
        if info is not None:
            check_focus_visible(info)
        stops.append(f"{info['tag']}#{info['id']}" if info else "body")
    raise Failure(f"{what}: not reached by {'Shift+' if backwards else ''}Tab in {limit} presses; stops: {stops}")


def has_id(value):
    return lambda info: info["id"] == value


def id_starts(prefix):
    return lambda info: info["id"].startswith(prefix)


# `nameOf(element)`: a control's accessible name (web_client_tests uses it too).
NAME_OF_JS = r"""
// The accessible name from what a person can rely on: aria-labelledby, aria-label, a <label>, a button's
// or link's own text, an input button's value, an image's alt. A placeholder or a title does not count.
const nameOf = (e) => {
  const by = (e.getAttribute('aria-labelledby') || '').split(/\s+/).filter(Boolean)
    .map((id) => document.getElementById(id)).filter(Boolean).map((n) => n.textContent).join(' ').trim();
  if (by) return by;
  const aria = (e.getAttribute('aria-label') || '').trim();
  if (aria) return aria;
  if (e.labels && e.labels.length) {
    const text = [...e.labels].map((l) => l.textContent).join(' ').trim();
    if (text) return text;
  }
  if (e.tagName === 'BUTTON' || e.tagName === 'A') {
    const text = (e.textContent || '').trim();
    if (text) return text;
    const img = e.querySelector('img[alt]');
    if (img && img.alt.trim()) return img.alt.trim();
  }
  if (e.tagName === 'INPUT' && ['submit', 'button', 'reset'].includes(e.type)) return (e.value || '').trim();
  if (e.tagName === 'INPUT' && e.type === 'image') return (e.alt || '').trim();
  return '';
};
"""

ACCESSIBILITY_JS = PAGE_COLOURS_JS + r"""
const c = window.__latticeColours;
const visible = (e) => {
  const r = e.getBoundingClientRect();
  const s = getComputedStyle(e);
  return r.width > 1 && r.height > 1 && s.visibility !== 'hidden' && s.display !== 'none' && !e.closest('[hidden]');
};
""" + NAME_OF_JS + r"""const describe = (e) => `${e.tagName.toLowerCase()}${e.id ? '#' + e.id : ''}${e.className ? '.' + String(e.className).split(' ').join('.') : ''}`;
const controls = [...document.querySelectorAll('input:not([type=hidden]), select, textarea, button, a[href], [role=button], [tabindex]')];
const unnamed = controls.filter((e) => !nameOf(e)).map(describe);
const images = [...document.querySelectorAll('img, input[type=image], svg, [role=img]')];
const noAlt = images.filter((e) => {
  if (e.tagName === 'IMG' || e.tagName === 'INPUT') return !e.hasAttribute('alt');
  return e.getAttribute('aria-hidden') !== 'true' && !(e.getAttribute('aria-label') || '').trim() && !e.querySelector('title');
}).map(describe);
const texts = [];
for (const e of document.body.querySelectorAll('*')) {
  if (['SCRIPT', 'STYLE', 'NOSCRIPT'].includes(e.tagName) || !visible(e) || e.closest(':disabled')) continue;
  const s = getComputedStyle(e);
  const own = [...e.childNodes].filter((n) => n.nodeType === 3).map((n) => n.textContent).join('').trim();
  const fg = c.parse(s.color);
  fg[3] *= c.opacity(e);
  if (own) texts.push({ what: describe(e), text: own.slice(0, 40), fg, bg: c.background(e), size: parseFloat(s.fontSize) });
  if ((e.tagName === 'INPUT' || e.tagName === 'TEXTAREA') && e.placeholder && !e.value) {
    const p = c.parse(getComputedStyle(e, '::placeholder').color);
    texts.push({ what: describe(e) + '::placeholder', text: e.placeholder.slice(0, 40), fg: p, bg: c.background(e), size: parseFloat(s.fontSize) });
  }
}
const root = document.documentElement;
const wide = [...document.body.querySelectorAll('*')].filter((e) => visible(e) && e.getBoundingClientRect().right > root.clientWidth + 0.5)
  .slice(0, 8).map((e) => `${describe(e)} right=${Math.round(e.getBoundingClientRect().right)}`);
const positiveTabindex = [...document.querySelectorAll('[tabindex]')].filter((e) => Number(e.getAttribute('tabindex')) > 0).map(describe);
return { unnamed, noAlt, texts, positiveTabindex, scrollWidth: root.scrollWidth, clientWidth: root.clientWidth,
         bodyScrollWidth: document.body.scrollWidth, wide, controls: controls.length };
"""


def check_accessibility(driver, page, phone=False):
    """Names on every control, alt on images, 4.5:1 text contrast; on a phone, no sideways scrolling."""
    found = driver.execute_script(ACCESSIBILITY_JS)
    check(not found["unnamed"], f"{page}: controls without an accessible name: {found['unnamed']}")
    check(not found["noAlt"], f"{page}: images without alt: {found['noAlt']}")
    check(not found["positiveTabindex"], f"{page}: a positive tabindex changes the focus order: {found['positiveTabindex']}")
    low = []
    for sample in found["texts"]:
        background = sample["bg"][:3]
        ratio = contrast(over(sample["fg"], background), background)
        if ratio < 4.5:
            low.append(f"{sample['what']} {sample['text']!r} {ratio:.2f}:1")
    check(found["texts"], f"{page}: no text found to check")
    check(not low, f"{page}: text under 4.5:1: {low}")
    # Chrome's own accessibility tree: no focusable or form node without a name.
    tree = driver.execute_cdp_cmd("Accessibility.getFullAXTree", {})
    roles = {"button", "link", "textbox", "checkbox", "combobox", "listbox", "radio", "searchbox", "spinbutton", "switch"}
    nameless = [node.get("role", {}).get("value") for node in tree.get("nodes", [])
                if not node.get("ignored") and node.get("role", {}).get("value") in roles
                and not str(node.get("name", {}).get("value", "")).strip()]
    check(not nameless, f"{page}: the accessibility tree has unnamed {nameless}")
    if phone:
        check(found["scrollWidth"] <= found["clientWidth"] and found["bodyScrollWidth"] <= found["clientWidth"],
              f"{page}: scrolls sideways at {found['clientWidth']} px (content {found['scrollWidth']} px): {found['wide']}")
    return found


def quit_all(drivers):
    """Closes every browser; one that is already gone does not stop the others."""
    for driver in drivers:
        try:
            driver.quit()
        except Exception:  # noqa: BLE001
            pass


def shoot_both(driver, name):
    """Screenshots of the page at 1280 x 800 (`name`.png) and 390 x 844 (`name`-phone.png), each checked for
    accessibility (names, contrast, no sideways scrolling on the phone)."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False})
    check_accessibility(driver, name)
    screenshot(driver, name + ".png")
    phone(driver, True)
    check_accessibility(driver, name, phone=True)
    screenshot(driver, name + "-phone.png")
    phone(driver, False)


def phone(driver, on):
    """A phone-sized viewport (390 x 844 CSS pixels, mobile) or back to the window's own."""
    if on:
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": True})
    else:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def grant_clipboard(driver, origin):
    driver.execute_cdp_cmd("Browser.grantPermissions",
                           {"origin": origin, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]})


def clipboard_text(driver):
    return driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        navigator.clipboard.readText().then(done, (error) => done('ERROR ' + error));""")


def signed_out(driver):
    """Forgets the browser's session cookie and this origin's storage (a fresh visitor)."""
    driver.execute_script("try { localStorage.clear(); sessionStorage.clear(); } catch (_) {}")
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    driver.get("about:blank")  # the next page is a new load, not a fragment change of this one


def wait_ready(driver, who):
    wait_for(driver, lambda d: d.execute_script("return document.body && document.body.dataset.ready") == "true"
             and d.find_element(By.ID, "who").text == who, f"the web client is ready for {who}")



def main():
    parser = argparse.ArgumentParser(description="Lattice browser tests")
    parser.add_argument("-k", action="append", default=[], metavar="TEXT",
                        help="run only the tests whose name contains TEXT (repeatable)")
    chosen = [text.lower() for text in parser.parse_args().k]
    directory = tempfile.mkdtemp(prefix="lattice-browser-")
    server = Server(directory)
    alice = CLI(os.path.join(directory, "alice"))
    dave = CLI(os.path.join(directory, "dave"))
    erin = CLI(os.path.join(directory, "erin"))
    drivers = []
    results = []
    started = time.monotonic()

    def test(name, body):
        begin = time.monotonic()
        try:
            body()
            results.append((name, True))
            print(f"ok   {name} ({time.monotonic() - begin:.1f} s)")
        except Exception as error:
            results.append((name, False))
            print(f"FAIL {name}: {error}")
            if not isinstance(error, Failure):
                traceback.print_exc()

    try:
        print(f"server {server.url}, chromium {subprocess.run(['chromium', '--version'], capture_output=True, text=True).stdout.strip()}")
        alice.run("signup", "alice", "--server", server.url)
        dave.run("signup", "dave", "--server", server.url)
        alice.run("list", "create", "Groceries")
        alice.run("list", "add", "Groceries", "Milk", "--tag", "dairy")
        alice.run("list", "add", "Groceries", XSS_ITEM)
        alice.run("share", "create", "Groceries", "--public-permission", "read-write")
        groceries = alice.run("share", "url", "Groceries")
        expiring = alice.run("share", "url", "Groceries", "--expires", "1s")
        expiring_made = time.monotonic()
        single = alice.run("share", "url", "Groceries", "--max-uses", "1")
        dave.run("accept", single, "--yes")  # uses the single-use link up
        alice.run("list", "create", XSS_TITLE)
        alice.run("list", "add", XSS_TITLE, "Cake")
        alice.run("share", "create", XSS_TITLE, "--public-permission", "read-only")
        party = alice.run("share", "url", XSS_TITLE, "--permission", "read-only")

        chain = [
            ("share link opened -> sign up -> join -> items shown", "share_page_then_sign_up_and_join"),
            ("user text shown as text, no dialog, no console errors or CSP violations", "user_text_is_text"),
            ("CSP, nosniff and Referrer-Policy headers; JSON for API clients", "security_headers"),
            ("read-only participant sees no edit controls; a forced write is refused", "read_only_sees_no_edit_controls"),
            ("concurrent edits from two browsers and the CLI converge to lattice list show --json", "concurrent_edits_converge"),
            ("a write refused by the server is rolled back on screen with its reason", "refused_write_is_rolled_back"),
            ("removal from the share takes the list off screen", "removal_takes_the_list_off_screen"),
            ("lattice login --web: the link signs a browser in once", "sign_in_link_from_the_cli"),
            ("the owner in the browser: lists, items, sharing panel; a deletion leaves a participant's screen",
             "owner_in_the_browser"),
        ]
        alone = [
            ("keyboard only: sign up, create a list, add, check and tag an item, make and copy a share link",
             "keyboard_only_walkthrough"),
            ("Copy without the asynchronous clipboard falls back and says so", "copy_without_the_async_clipboard"),
            ("an invited person signs in from the share page (another tab), comes back, joins; others see 'not for you'",
             "invited_person_joins_from_the_share_page"),
            ("a sign-in link comes back to a public share page; open-redirect attempts are refused",
             "sign_in_comes_back_to_the_share_page"),
            ("accessibility: names, alt, 4.5:1 contrast, no sideways scrolling at 390x844", "accessibility_checked"),
            ("expired, tampered, used-up and made-up links show the friendly page", "invalid_links_show_the_friendly_page"),
            ("another account's sign-in link asks first and switches only when confirmed (login CSRF)",
             "another_accounts_sign_in_link_asks_first"),
        ]
        matches = lambda name: not chosen or any(text in name.lower() for text in chosen)
        last_chain = max([index for index, (name, _) in enumerate(chain) if matches(name)], default=-1)
        bob = carol = None
        if last_chain >= 0:
            bob, carol = browser(), browser()
            drivers.extend([bob, carol])

        def share_page_then_sign_up_and_join():
            bob.get(groceries)
            wait_for(bob, lambda d: d.find_element(By.ID, "title").text == "Groceries", "the share page shows the title")
            check(bob.find_element(By.ID, "owner").text == "Shared by alice", "who shared it")
            check(bob.find_element(By.ID, "access").text == "You can view and edit this list.", "the access in words")
            check(bob.find_element(By.ID, "count").text == "2 items", "how many items")
            check(f"lattice accept {groceries}" not in page_text(bob), "the terminal command is folded away")
            bob.find_element(By.CSS_SELECTOR, "details.terminal summary").click()
            check(f"lattice accept {groceries}" in page_text(bob), "the terminal command, unfolded")
            # The link as a sentence or a messaging app leaves it: trailing punctuation is dropped.
            for tail in [".", ").", "%22", "!?"]:
                bob.get(groceries + tail)
                wait_for(bob, lambda d: d.current_url == groceries and d.find_elements(By.ID, "title"),
                         f"the link with {tail!r} after it opens the share page")
            shoot_both(bob, "share-page")
            sign_up_through(bob, groceries, "bob")
            check(sorted(i[0] for i in items_on_page(bob)) == sorted(["Milk", XSS_ITEM]), f"bob's items: {items_on_page(bob)}")
            screenshot(bob, "list.png")
            sign_up_through(carol, groceries, "carol")

        def user_text_is_text():
            check(item_row(bob, XSS_ITEM) is not None, "the XSS item text is shown as text")
            check(bob.execute_script("return document.querySelectorAll('main img, nav img').length") == 0, "no img element")
            no_dialog(bob)
            carol.get(party)
            wait_for(carol, lambda d: d.find_element(By.ID, "title").text == XSS_TITLE, "the </script> title shows as text")
            check(carol.execute_script("return document.scripts.length") == 1, "the page has only its own module script")
            no_dialog(carol)
            carol.find_element(By.ID, "join").click()
            wait_for(carol, lambda d: d.find_elements(By.ID, "list-title") and d.find_element(By.ID, "list-title").text == XSS_TITLE,
                     "the </script> list opens with its title as text")
            no_dialog(carol)
            for driver in (bob, carol):
                problems = console_problems(driver)
                check(not problems, f"console errors or CSP violations: {problems}")

        def security_headers():
            for url in [groceries, server.url + "/", server.url + "/web/app.js"]:
                status, found, _ = headers(url)
                csp = found.get("Content-Security-Policy", "")
                check(status == 200, f"{url}: {status}")
                for directive in ["default-src 'none'", "script-src 'self'", "frame-ancestors 'none'"]:
                    check(directive in csp, f"{url}: CSP {csp!r} lacks {directive}")
                check("unsafe-inline" not in csp and "unsafe-eval" not in csp, f"{url}: CSP {csp!r}")
                check(found.get("X-Content-Type-Options") == "nosniff", f"{url}: nosniff")
            status, found, _ = headers(groceries)
            check(found.get("Referrer-Policy") == "no-referrer", f"share page Referrer-Policy: {found.get('Referrer-Policy')}")
            status, found, body = headers(groceries, accept="application/json")
            check(found.get("Content-Type", "").startswith("application/json") and "lattice accept" in body, "JSON for API clients")

        def invalid_links_show_the_friendly_page():
            fresh = browser()
            drivers.append(fresh)
            remaining = 62 - (time.monotonic() - expiring_made)  # 1 s expiry + the 60 s verification leeway
            if remaining > 0:
                time.sleep(remaining)
            tampered = groceries[:-3] + ("AAA" if not groceries.endswith("AAA") else "BBB")
            for label, url in [("expired", expiring), ("tampered", tampered), ("used up", single),
                               ("made up", server.url + "/share/not-a-token")]:
                status, found, _ = headers(url)
                check(status == 404, f"{label} link: HTTP {status}")
                check(found.get("Referrer-Policy") == "no-referrer", f"{label}: Referrer-Policy")
                fresh.get(url)
                wait_for(fresh, lambda d: d.find_element(By.TAG_NAME, "h1").text == "This link does not work", f"{label}: friendly page")
                check("The share link is invalid, expired or revoked." in page_text(fresh), f"{label}: the uniform cause")
                check("Groceries" not in page_text(fresh), f"{label}: the title leaked")
            shoot_both(fresh, "invalid-link")
            fresh.quit()
            drivers.remove(fresh)

        def concurrent_edits_converge():
            for driver in (bob, carol):
                open_list(driver, "Groceries")
            # At once: bob edits Milk's text, carol tags it and checks it, alice (CLI) removes its tag and
            # adds an item, bob adds a tag too.
            alice_thread = threading.Thread(target=lambda: (alice.run("list", "edit", "Groceries", "Milk", "--remove-tag", "dairy",
                                                                      "--add-tag", "fresh"),
                                                            alice.run("list", "add", "Groceries", "Bread", "--tag", "bakery")))
            alice_thread.start()
            act(lambda: item_row(carol, "Milk").find_element(By.CSS_SELECTOR, "input[type=checkbox]").click())
            act(lambda: item_row(bob, "Milk").find_element(By.CSS_SELECTOR, "button.edit").click())
            act(lambda: (wait_for(bob, lambda d: d.find_element(By.ID, "edit-input"), "bob's edit field").clear(),
                         bob.find_element(By.ID, "edit-input").send_keys("Oat milk")))
            act(lambda: item_row(carol, "Milk").find_element(By.CSS_SELECTOR, "button.add-tag").click())
            act(lambda: wait_for(carol, lambda d: d.find_element(By.ID, "tag-input"), "carol's tag field").send_keys("cold"))
            act(lambda: bob.find_element(By.CSS_SELECTOR, "#edit-form button[type=submit]").click())
            act(lambda: carol.find_element(By.CSS_SELECTOR, "#tag-form button[type=submit]").click())
            alice_thread.join(timeout=60)
            deadline = time.monotonic() + WAIT
            while True:
                expected = sorted(items_in_cli(alice, "Groceries"))
                shown = [sorted(items_on_page(d)) for d in (bob, carol)]
                if shown[0] == expected and shown[1] == expected:
                    break
                if time.monotonic() > deadline:
                    raise Failure(f"not converged: cli {expected}, bob {shown[0]}, carol {shown[1]}")
                time.sleep(0.3)
            milk = [i for i in expected if i[0] == "Oat milk"]
            check(milk and milk[0][1] is True and milk[0][2] == ["cold", "fresh"], f"the merged item: {expected}")
            print(f"  converged: {expected}")

        def read_only_sees_no_edit_controls():
            open_list(carol, XSS_TITLE)
            check(carol.find_element(By.ID, "list-access").text.endswith("can view"), "carol's access")
            for selector in ["#add-item", "button.edit", "button.remove", "button.add-tag", "#rename", "#delete-list", ".tag-remove"]:
                check(not carol.find_elements(By.CSS_SELECTOR, selector), f"read-only sees {selector}")
            check(not carol.find_element(By.CSS_SELECTOR, "#items input[type=checkbox]").is_enabled(), "the checkbox is disabled")
            # A write forced through the API from the page is refused by the server.
            reply = carol.execute_async_script("""
                const done = arguments[arguments.length - 1];
                const listID = document.querySelector('.list-link.current').dataset.list;
                (async () => {
                  const session = await (await fetch('/auth/session')).json();
                  const zones = await (await fetch(`/database/1/${session.container}/${session.environment}/shared/changes/database`, {
                    method: 'POST', headers: {'X-Lattice-CSRF': session.csrfToken}, body: '{}'})).json();
                  const out = [];
                  for (const z of zones.zones) {
                    const r = await fetch(`/database/1/${session.container}/${session.environment}/shared/records/modify`, {
                      method: 'POST', headers: {'X-Lattice-CSRF': session.csrfToken},
                      body: JSON.stringify({zoneID: z.zoneID, operations: [{operationType: 'create', record: {
                        recordName: 'forced', recordType: 'Item', fields: {text: {value: 'forced'}}, parent: {recordName: listID}}}]})});
                    out.push([r.status, await r.json()]);
                  }
                  done(out);
                })().catch((e) => done(String(e)));""")
            codes = [r[1].get("records", [{}])[0].get("serverErrorCode") or r[1].get("serverErrorCode") for r in reply]
            check(reply and all(code in ("PERMISSION_FAILURE", "ACCESS_DENIED") for code in codes),
                  f"the forced write was not refused for its permission: {reply}")
            print(f"  forced writes answered {codes}")
            items = items_in_cli(alice, XSS_TITLE)
            check([i[0] for i in items] == ["Cake"], f"nothing was written: {items}")

        def refused_write_is_rolled_back():
            open_list(carol, "Groceries")
            # carol's page stops hearing of changes (her changes/* requests are blocked), so it still shows
            # her edit controls after alice makes her read-only; her next write is refused by the server.
            carol.execute_cdp_cmd("Network.enable", {})
            carol.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/changes/*"]})
            try:
                alice.run("share", "set-permission", "Groceries", "carol", "read-only")
                act(lambda: item_row(carol, "Bread").find_element(By.CSS_SELECTOR, "input[type=checkbox]").click())
                wait_for(carol, lambda d: "Not saved:" in d.find_element(By.ID, "notice").text, "the refusal is shown")
                reason = carol.find_element(By.ID, "notice").text
                wait_for(carol, lambda d: not item_row(d, "Bread").find_element(By.CSS_SELECTOR, "input[type=checkbox]").is_selected(),
                         "the check is rolled back on screen")
                print(f"  notice: {reason}")
                check([i[1] for i in items_in_cli(alice, "Groceries") if i[0] == "Bread"] == [False], "nothing was written")
            finally:
                carol.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
            wait_for(carol, lambda d: not d.find_elements(By.ID, "add-item")
                     and d.find_element(By.ID, "list-access").text.endswith("can view"),
                     "carol's page turns read-only once it hears of the change")

        def removal_takes_the_list_off_screen():
            open_list(bob, "Groceries")
            alice.run("share", "remove", "Groceries", "bob")
            wait_for(bob, lambda d: not [b for b in d.find_elements(By.CSS_SELECTOR, "#lists .list-link .title") if b.text == "Groceries"]
                     and "no longer available" in d.find_element(By.ID, "notice").text,
                     "the list leaves bob's page with a notice")
            check(not bob.find_elements(By.ID, "items"), "the list is closed")

        def sign_in_link_from_the_cli():
            link = alice.run("login", "--web")
            check("#signin=lt_" in link, f"the link: {link}")
            bob.find_element(By.ID, "signout").click()
            wait_for(bob, lambda d: d.find_elements(By.ID, "signup-form"), "signed out: the sign-in page")
            bob.get(link)
            wait_for(bob, lambda d: d.find_elements(By.ID, "who") and d.find_element(By.ID, "who").text == "alice",
                     "signed in as alice through the link")
            check("signin" not in bob.current_url, f"the secret left the address bar: {bob.current_url}")
            open_list(bob, "Groceries")
            fresh = browser()
            drivers.append(fresh)
            fresh.get(link)
            wait_for(fresh, lambda d: "invalid, expired or already used" in page_text(d), "a second use of the link is refused")
            fresh.quit()
            drivers.remove(fresh)

        def owner_in_the_browser():
            owner = bob  # signed in as alice by the previous test
            wait_for(owner, lambda d: d.find_element(By.ID, "who").text == "alice", "alice's browser")
            type_into(owner, "new-list-title", "Picnic")
            owner.find_element(By.CSS_SELECTOR, "#new-list button[type=submit]").click()
            wait_for(owner, lambda d: d.find_elements(By.ID, "list-title") and d.find_element(By.ID, "list-title").text == "Picnic",
                     "the new list opens")
            for text, tags in [("Plates", "paper, party"), ("Cups", "")]:
                type_into(owner, "new-item", text)
                type_into(owner, "new-item-tags", tags)
                act(lambda: owner.find_element(By.CSS_SELECTOR, "#add-item button[type=submit]").click())
                wait_for(owner, lambda d: text in [i[0] for i in items_on_page(d)], f"{text} is added")
            act(lambda: item_row(owner, "Cups").find_element(By.CSS_SELECTOR, "button.remove").click())
            wait_for(owner, lambda d: [i[0] for i in items_on_page(d)] == ["Plates"], "Cups is removed")
            act(lambda: owner.find_element(By.ID, "rename").click())
            act(lambda: (owner.find_element(By.ID, "rename-input").clear(),
                         owner.find_element(By.ID, "rename-input").send_keys("Summer picnic", Keys.ENTER)))
            wait_for(owner, lambda d: d.find_element(By.ID, "list-title").text == "Summer picnic", "the list is renamed")
            shown = items_in_cli(alice, "Summer picnic")
            check(shown == [["Plates", False, ["paper", "party"]]], f"the CLI sees {shown}")

            erin.run("signup", "erin", "--server", server.url)
            act(lambda: owner.find_element(By.ID, "share-button").click())
            wait_for(owner, lambda d: d.find_element(By.ID, "invite-name"), "the share panel")
            type_into(owner, "invite-name", "erin")
            act(lambda: Select(owner.find_element(By.ID, "invite-permission")).select_by_value("readWrite"))
            act(lambda: owner.find_element(By.CSS_SELECTOR, "#invite-form button[type=submit]").click())
            def participant(d, name):
                rows = d.find_elements(By.CSS_SELECTOR, f"#participants li[data-participant='{name}']")
                return rows[0] if rows else None
            wait_for(owner, lambda d: participant(d, "erin") and "can edit" in participant(d, "erin").text, "erin is invited")
            def cli_permission(name):
                found = [p for p in alice.json("share", "participants", "Summer picnic")["participants"] if p["name"] == name]
                return (found[0]["permission"], found[0]["status"]) if found else None
            check(cli_permission("erin") == ("readWrite", "pending"), f"the CLI sees erin as {cli_permission('erin')}")
            act(lambda: Select(participant(owner, "erin").find_element(By.TAG_NAME, "select")).select_by_value("readOnly"))
            wait_for(owner, lambda d: participant(d, "erin") and "can view" in participant(d, "erin").text, "erin's permission changes")
            check(cli_permission("erin") == ("readOnly", "pending"), f"the CLI sees erin as {cli_permission('erin')}")
            act(lambda: participant(owner, "erin").find_element(By.CSS_SELECTOR, "button").click())
            wait_for(owner, lambda d: participant(d, "erin") is None or "removed" in participant(d, "erin").text, "erin is removed")
            check(cli_permission("erin") in (None, ("readOnly", "removed"), ("readWrite", "removed")), "erin is removed in the CLI")
            act(lambda: Select(owner.find_element(By.ID, "link-permission")).select_by_value("readOnly"))
            act(lambda: Select(owner.find_element(By.ID, "link-expiry")).select_by_value("3600"))
            act(lambda: owner.find_element(By.ID, "link-single").click())
            act(lambda: owner.find_element(By.CSS_SELECTOR, "#link-form button[type=submit]").click())
            wait_for(owner, lambda d: d.find_element(By.ID, "link-url").get_attribute("value").startswith(server.url + "/s/"),
                     "the short link is shown")
            link = act(lambda: owner.find_element(By.ID, "link-url").get_attribute("value"))
            status, _, body = headers(link)
            check(status == 200 and "You can view this list." in body and "Summer picnic" in body, f"the new link's page: {status}")
            dave.run("accept", link, "--yes")
            status, _, _ = headers(link)
            check(status == 404, f"the single-use link is used up: {status}")

            # Deleting a list takes it off a participant's screen with a notice.
            open_list(owner, XSS_TITLE)
            act(lambda: owner.find_element(By.ID, "delete-list").click())
            act(lambda: owner.find_element(By.ID, "delete-list").click())
            wait_for(carol, lambda d: XSS_TITLE not in [t.text for t in d.find_elements(By.CSS_SELECTOR, "#lists .list-link .title")]
                     and "no longer available" in d.find_element(By.ID, "notice").text, "the deleted list leaves carol's page")
            alice.run("sync")
            check(XSS_TITLE not in [l["title"] for l in alice.json("lists")], "the list is deleted")

        def keyboard_only_walkthrough():
            # Sign up, create a list, add an item, check it, tag it, make a share link and copy it: only
            # Tab, Shift+Tab, Enter, Space, Escape and typing. Every focus stop shows a visible ring.
            kb = browser()
            drivers.append(kb)
            grant_clipboard(kb, server.url)
            kb.get(server.url + "/")
            wait_for(kb, lambda d: d.find_elements(By.ID, "signup-name"), "the sign-in page")
            tab_to(kb, has_id("signup-name"), "the user name field")
            press(kb, "kim")
            tab_to(kb, lambda i: i["tag"] == "button" and i["name"] == "Sign up without a passkey", "the Sign up button")
            press(kb, Keys.ENTER)
            # The recovery codes: tick "I saved these codes" and continue, by keyboard.
            wait_for(kb, lambda d: d.find_elements(By.ID, "recovery-continue"), "the recovery codes")
            tab_to(kb, has_id("recovery-saved"), "the 'I saved these codes' box")
            press(kb, Keys.SPACE)
            tab_to(kb, has_id("recovery-continue"), "Continue")
            press(kb, Keys.ENTER)
            wait_ready(kb, "kim")
            tab_to(kb, has_id("new-list-title"), "the new list field")
            press(kb, "Chores", Keys.ENTER)
            wait_for(kb, lambda d: d.find_elements(By.ID, "list-title") and d.find_element(By.ID, "list-title").text == "Chores",
                     "the new list opens")
            tab_to(kb, has_id("new-item"), "the new item field")
            press(kb, "Sweep", Keys.ENTER)
            wait_for(kb, lambda d: [i[0] for i in items_on_page(d)] == ["Sweep"], "the item is added")
            check(focused(kb)["id"] == "new-item", f"the focus stays in the new item field: {focused(kb)}")
            box = tab_to(kb, id_starts("done-"), "the item's check box", backwards=True)
            press(kb, Keys.SPACE)
            wait_for(kb, lambda d: items_on_page(d) == [["Sweep", True, []]], "Space checks the item")
            item = box["id"][len("done-"):]
            # An inline form closes with Escape and gives the focus back to the button that opened it.
            tab_to(kb, has_id("edit-" + item), "the item's Edit button")
            press(kb, Keys.ENTER)
            wait_for(kb, lambda d: focused(d) and focused(d)["id"] == "edit-input", "Enter opens the edit field, focused")
            press(kb, Keys.ESCAPE)
            wait_for(kb, lambda d: focused(d) and focused(d)["id"] == "edit-" + item and not d.find_elements(By.ID, "edit-form"),
                     "Escape closes the edit field and the focus is back on Edit")
            tab_to(kb, has_id("tag-" + item), "the item's + Tag button")
            press(kb, Keys.ENTER)
            wait_for(kb, lambda d: focused(d) and focused(d)["id"] == "tag-input", "Enter opens the tag field, focused")
            press(kb, "home", Keys.ENTER)
            wait_for(kb, lambda d: items_on_page(d) == [["Sweep", True, ["home"]]], "the tag is added")
            wait_for(kb, lambda d: focused(d) and focused(d)["id"] == "tag-" + item,
                     "after the tag is saved the focus is back on + Tag (not lost to the page)")
            check_focus_visible(focused(kb))
            screenshot(kb, "keyboard-focus.png")
            tab_to(kb, has_id("share-button"), "the Share button", backwards=True)
            press(kb, Keys.ENTER)
            wait_for(kb, lambda d: d.find_elements(By.ID, "share-panel"), "Enter opens the share panel")
            tab_to(kb, has_id("make-link"), "the Make link button")
            press(kb, Keys.ENTER)
            wait_for(kb, lambda d: d.find_element(By.ID, "link-url").get_attribute("value").startswith(server.url + "/s/"),
                     "the short link is made")
            link = kb.find_element(By.ID, "link-url").get_attribute("value")
            tab_to(kb, has_id("copy-link"), "the Copy button")
            press(kb, Keys.SPACE)
            wait_for(kb, lambda d: d.find_element(By.ID, "notice").text == "Link copied.", "the copy is confirmed")
            copied = clipboard_text(kb)
            check(copied == link, f"the clipboard holds {copied!r}, not the link {link!r}")
            # Every control of the page (share panel open) is reached by Tab, once around.
            wanted = kb.execute_script("""
                return [...document.querySelectorAll('button, input, select, a[href], textarea')]
                  .filter((e) => !e.disabled && e.getClientRects().length && getComputedStyle(e).visibility !== 'hidden')
                  .map((e) => e.id || 'NO ID ' + e.outerHTML.slice(0, 80));""")
            missing = [w for w in wanted if w.startswith("NO ID ")]
            check(not missing, f"controls without an id (their focus cannot survive a live update): {missing}")
            kb.execute_script("document.getElementById('signout').focus()")  # the first control: one full round from here
            reached = {"signout"}
            for _ in range(len(wanted) + 3):
                press(kb, Keys.TAB)
                info = focused(kb)
                if info:
                    check_focus_visible(info)
                    reached.add(info["id"])
            check(set(wanted) <= reached, f"not reachable by Tab: {sorted(set(wanted) - reached)}")
            # What the keyboard did is on the server: a reload shows it, and the link opens.
            kb.refresh()
            wait_ready(kb, "kim")
            wait_for(kb, lambda d: items_on_page(d) == [["Sweep", True, ["home"]]], "the server kept the checked, tagged item")
            status, _, body = headers(link)
            check(status == 200 and "Chores" in body, f"the keyboard-made link's page: {status}")
            print(f"  {len(wanted)} controls reached by Tab, each with a visible focus ring")
            kb.quit()
            drivers.remove(kb)

        def copy_without_the_async_clipboard():
            # With the asynchronous clipboard refused (as on plain http away from 127.0.0.1), Copy falls
            # back to selecting the link and the copy command, and says so.
            cb = browser()
            drivers.append(cb)
            cli = CLI(os.path.join(directory, "lou"))
            cli.run("signup", "lou", "--server", server.url)
            cli.run("list", "create", "Books")
            cb.get(cli.run("login", "--web"))
            wait_ready(cb, "lou")
            open_list(cb, "Books")
            cb.execute_cdp_cmd("Browser.setPermission", {"origin": server.url, "permission": {"name": "clipboard-write"},
                                                         "setting": "denied"})
            cb.execute_cdp_cmd("Browser.setPermission", {"origin": server.url, "permission": {"name": "clipboard-read"},
                                                         "setting": "granted"})
            refused = cb.execute_async_script("""
                const done = arguments[arguments.length - 1];
                navigator.clipboard.writeText('x').then(() => done('written'), (e) => done('refused ' + e.name));""")
            check(refused.startswith("refused"), f"the asynchronous clipboard was not refused: {refused}")
            act(lambda: cb.find_element(By.ID, "share-button").click())
            act(lambda: wait_for(cb, lambda d: d.find_element(By.ID, "make-link"), "the share panel").click())
            wait_for(cb, lambda d: d.find_element(By.ID, "link-url").get_attribute("value").startswith(server.url + "/s/"),
                     "the short link is made")
            link = cb.find_element(By.ID, "link-url").get_attribute("value")
            act(lambda: cb.find_element(By.ID, "copy-link").click())
            wait_for(cb, lambda d: d.find_element(By.ID, "notice").text in ("Link copied.", "The link is selected: copy it with Ctrl+C (⌘C on a Mac)."),
                     "the fallback says what happened")
            said = cb.find_element(By.ID, "notice").text
            if said == "Link copied.":
                check(clipboard_text(cb) == link, "the copy command put the link on the clipboard")
            else:
                selected = cb.execute_script("const e = document.activeElement; return e.id === 'link-url' ? e.value.slice(e.selectionStart, e.selectionEnd) : null")
                check(selected == link, f"the link is selected for copying: {selected!r}")
            print(f"  fallback: {said}")
            cb.quit()
            drivers.remove(cb)

        def invited_person_joins_from_the_share_page():
            frank, gina = CLI(os.path.join(directory, "frank")), CLI(os.path.join(directory, "gina"))
            frank.run("signup", "frank", "--server", server.url)
            gina.run("signup", "gina", "--server", server.url)
            alice.run("list", "create", "Surprise party")
            alice.run("list", "add", "Surprise party", "Balloons")
            alice.run("share", "create", "Surprise party")  # invited people only
            alice.run("share", "invite", "Surprise party", "frank", "--permission", "read-write")
            link = alice.run("share", "url", "Surprise party")
            status, _, body = headers(link)
            check(status == 403 and "This link is not for you" in body and "Surprise" not in body,
                  f"signed out, the page is 'not for you' without the title: {status}")
            fb = browser()
            drivers.append(fb)
            fb.get(link)
            wait_for(fb, lambda d: d.find_element(By.TAG_NAME, "h1").text == "This link is not for you", "not for you, signed out")
            check("Surprise" not in fb.page_source, "the title leaked to a signed-out visitor")
            fb.find_element(By.LINK_TEXT, "Sign in").click()
            wait_for(fb, lambda d: d.find_elements(By.ID, "signup-form"), "the sign-in page")
            first = fb.current_window_handle
            # frank runs lattice login --web and opens its link in another tab.
            fb.switch_to.new_window("tab")
            fb.get(frank.run("login", "--web"))
            wait_for(fb, lambda d: d.current_url == link and d.find_elements(By.ID, "title"),
                     "the sign-in link's tab comes back to the share page")
            check(fb.find_element(By.ID, "title").text == "Surprise party", "frank, invited, sees the title")
            check(fb.find_element(By.ID, "owner").text == "Shared by alice", "and the owner")
            check(fb.find_element(By.ID, "access").text == "You can view and edit this list.", "and his access")
            second = fb.current_window_handle
            fb.switch_to.window(first)
            wait_for(fb, lambda d: d.current_url == link and d.find_elements(By.ID, "join"),
                     "the first tab (where sign-in began) goes back to the share page too")
            fb.close()
            fb.switch_to.window(second)
            check_accessibility(fb, "share page, invited, with Join")
            tab_to(fb, has_id("join"), "the Join button")  # joined by keyboard
            press(fb, Keys.ENTER)
            wait_for(fb, lambda d: d.execute_script("return document.body.dataset.ready") == "true"
                     and d.find_elements(By.ID, "list-title") and d.find_element(By.ID, "list-title").text == "Surprise party",
                     "after Join the list is open in frank's web client")
            check(items_on_page(fb) == [["Balloons", False, []]], f"frank's items: {items_on_page(fb)}")
            check(fb.find_element(By.ID, "list-access").text == "alice · can edit", "owner and access in the client")
            found = [p for p in alice.json("share", "participants", "Surprise party")["participants"] if p["name"] == "frank"]
            check(found and found[0]["status"] == "accepted", f"the CLI sees frank as {found}")
            # Anyone else signed in is told the link is not for them, without the title.
            fb.find_element(By.ID, "signout").click()
            wait_for(fb, lambda d: d.find_elements(By.ID, "signup-form"), "frank signed out")
            fb.get(gina.run("login", "--web"))
            wait_ready(fb, "gina")
            fb.get(link)
            wait_for(fb, lambda d: d.find_element(By.TAG_NAME, "h1").text == "This link is not for you", "not for gina")
            check("Surprise" not in fb.page_source, "the title leaked to gina")
            check(not fb.find_elements(By.ID, "join") and not fb.find_elements(By.LINK_TEXT, "Sign in"),
                  "gina, signed in, is offered neither Join nor sign-in")
            check_accessibility(fb, "not-for-you page, signed in")
            fb.quit()
            drivers.remove(fb)

        def sign_in_comes_back_to_the_share_page():
            hank = CLI(os.path.join(directory, "hank"))
            hank.run("signup", "hank", "--server", server.url)
            alice.run("list", "create", "Barbecue")
            alice.run("share", "create", "Barbecue", "--public-permission", "read-write")
            link = alice.run("share", "url", "Barbecue")
            hb = browser()
            drivers.append(hb)
            # A public link opened signed out; the sign-in link typed into the same tab (no click on Sign in).
            hb.get(link)
            wait_for(hb, lambda d: d.find_elements(By.LINK_TEXT, "Sign in"), "the share page, signed out")
            hb.get(hank.run("login", "--web"))
            wait_for(hb, lambda d: d.current_url == link and d.find_elements(By.ID, "join"),
                     "after the sign-in link, back on the share page with Join")
            # Open-redirect attempts: a return path that is not a relative /share/ path is refused, whether
            # it comes in the address (#next) or was planted in storage; the sign-in lands on / instead.
            attempts = ["https://evil.example/share/x", "//evil.example/share/x", "/\\evil.example/share/x",
                        "javascript:alert(1)", "/share/../../evil", "/share/x?next=//evil.example", "/share//evil.example",
                        "/share/.%2e/evil"]
            for bad in attempts:
                signed_out(hb)
                hb.get(server.url + "/#next=" + urllib.parse.quote(bad, safe=""))
                wait_for(hb, lambda d: d.find_elements(By.ID, "signup-form"), "the sign-in page")
                hb.get(hank.run("login", "--web"))
                wait_ready(hb, "hank")
                check(hb.current_url.startswith(server.url + "/") and "/share/" not in hb.current_url
                      and "evil" not in hb.current_url, f"#next={bad} sent the browser to {hb.current_url}")
                no_dialog(hb)
            for stored in [json.dumps({"path": "//evil.example/share/x", "until": 4102444800000}),
                           json.dumps({"path": urllib.parse.urlparse(link).path, "until": 1}),  # expired
                           "not json"]:
                signed_out(hb)
                hb.get(server.url + "/")
                wait_for(hb, lambda d: d.find_elements(By.ID, "signup-form"), "the sign-in page")
                hb.execute_script("localStorage.setItem('lattice.next', arguments[0])", stored)
                hb.get(hank.run("login", "--web"))
                wait_ready(hb, "hank")
                check(hb.current_url.rstrip("/").split("#")[0] == server.url, f"stored {stored} sent the browser to {hb.current_url}")
            # Sign-up from a planted #next: also refused.
            signed_out(hb)
            hb.get(server.url + "/#signup&next=" + urllib.parse.quote("//evil.example/share/x", safe=""))
            field = wait_for(hb, lambda d: d.find_element(By.ID, "signup-name"), "the sign-up page")
            field.send_keys("ivan", Keys.ENTER)
            save_recovery_codes(hb)
            wait_ready(hb, "ivan")
            check(hb.current_url.startswith(server.url + "/") and "evil" not in hb.current_url, f"sign-up went to {hb.current_url}")
            print(f"  {len(attempts) + 4} redirect attempts refused")
            hb.quit()
            drivers.remove(hb)

        def accessibility_checked():
            lena = CLI(os.path.join(directory, "lena"))
            lena.run("signup", "lena-with-a-rather-long-user-name-that-goes-on", "--server", server.url)
            long_title = "Camping trip with the whole extended family and friends 2027"
            lena.run("list", "create", long_title)
            lena.run("list", "add", long_title, "Tent", "--tag", "areallylongtagwithoutanyspaceorhyphentobreakitanywhereatall")
            lena.run("list", "add", long_title, "Sleepingbagsandpillowsandblanketsforeveryoneincludingthedog")
            lena.run("list", "check", long_title, "Tent")
            lena.run("share", "create", long_title)
            lena.run("share", "invite", long_title, "dave", "--permission", "read-write")
            link = lena.run("share", "url", long_title)  # for invited people only
            lena.run("list", "create", "Picnic blanket")
            lena.run("share", "create", "Picnic blanket", "--public-permission", "read-only")
            public = lena.run("share", "url", "Picnic blanket")
            ab = browser()
            drivers.append(ab)
            checked = []

            def both(page):
                phone(ab, False)
                check_accessibility(ab, page)
                phone(ab, True)
                time.sleep(0.2)
                found = check_accessibility(ab, page + " (phone)", phone=True)
                phone(ab, False)
                checked.append(f"{page}: {found['controls']} controls, {len(found['texts'])} texts")

            ab.get(server.url + "/")
            wait_for(ab, lambda d: d.find_elements(By.ID, "signup-form"), "the sign-in page")
            both("sign-in page")
            ab.get(public)
            wait_for(ab, lambda d: d.find_elements(By.ID, "title"), "the share page")
            both("share page, signed out")
            ab.get(link)
            wait_for(ab, lambda d: d.find_element(By.TAG_NAME, "h1").text == "This link is not for you", "the not-for-you page")
            both("not-for-you page, signed out")
            ab.get(server.url + "/share/not-a-token")
            wait_for(ab, lambda d: d.find_element(By.TAG_NAME, "h1").text == "This link does not work", "the invalid-link page")
            both("invalid-link page")
            # Signed in from here, the browser goes back to the last share page it showed (the not-for-you one).
            ab.get(lena.run("login", "--web"))
            wait_for(ab, lambda d: d.current_url == link and "This is your list." in page_text(d), "back on the share page, as its owner")
            both("share page, the owner")
            ab.get(server.url + "/")
            wait_ready(ab, "lena-with-a-rather-long-user-name-that-goes-on")
            open_list(ab, long_title)
            act(lambda: ab.find_element(By.ID, "share-button").click())
            wait_for(ab, lambda d: d.find_elements(By.CSS_SELECTOR, "#participants li[data-participant='dave']"), "the participants")
            act(lambda: ab.find_element(By.ID, "make-link").click())
            wait_for(ab, lambda d: d.find_element(By.ID, "link-url").get_attribute("value"), "the link")
            act(lambda: ab.find_element(By.CSS_SELECTOR, "#items button.add-tag").click())
            wait_for(ab, lambda d: d.find_elements(By.ID, "tag-input"), "the tag field")
            both("list page with the share panel and a tag field open")
            phone(ab, True)
            ab.execute_script("document.getElementById('list').scrollIntoView()")
            time.sleep(0.2)
            screenshot(ab, "list-phone.png")
            phone(ab, False)
            for line in checked:
                print(f"  {line}")
            ab.quit()
            drivers.remove(ab)

        def another_accounts_sign_in_link_asks_first():
            # nora is signed in; a stranger (mallory) gets her to open mallory's sign-in link. Her browser
            # must not switch (her next lists would land in mallory's account) until she says so.
            mallory = CLI(os.path.join(directory, "mallory"))
            mallory.run("signup", "mallory", "--server", server.url)
            nb = browser()
            drivers.append(nb)
            nb.get(server.url + "/")
            wait_for(nb, lambda d: d.find_element(By.ID, "signup-name"), "the sign-in page").send_keys("nora", Keys.ENTER)
            save_recovery_codes(nb)
            wait_ready(nb, "nora")

            def signed_in_as(d):
                return d.execute_async_script("""
                    const done = arguments[arguments.length - 1];
                    fetch('/auth/session').then((r) => r.json()).then((j) => done(j.name || j.serverErrorCode), (e) => done('' + e));""")

            def question(d):
                found = d.find_elements(By.ID, "switch-account")
                return found[0] if found and found[0].is_displayed() else None

            link = mallory.run("login", "--web")
            for how in ["opened in the signed-in tab (a fragment change)", "opened as a new page load"]:
                if how.endswith("page load"):
                    nb.get("about:blank")
                nb.get(link)
                asked = wait_for(nb, question, f"the link {how}: the page asks before switching")
                check("mallory" in asked.text and "nora" in asked.text, f"the question names both accounts: {asked.text!r}")
                check(nb.find_element(By.ID, "switch-account-confirm").text == "Switch to mallory", "the Switch button")
                check(nb.find_element(By.ID, "switch-account-stay").text == "Stay as nora", "the Stay button")
                check("signin" not in nb.current_url, f"the secret left the address bar: {nb.current_url}")
                time.sleep(0.5)  # nothing switches while the question waits
                check(signed_in_as(nb) == "nora", f"still nora on the server while asked: {signed_in_as(nb)}")
                if how.startswith("opened in"):
                    check_accessibility(nb, "the switch-account question")
                    nb.find_element(By.ID, "switch-account-stay").click()
                    wait_for(nb, lambda d: not question(d), "Stay closes the question")
                    wait_ready(nb, "nora")
                    check(signed_in_as(nb) == "nora", "Stay keeps nora signed in")
                    nb.get(link + "&list=x")  # a fragment change again: the same unspent link asks again
                    wait_for(nb, question, "the unspent link asks again")
                    nb.find_element(By.ID, "switch-account-stay").click()
                    wait_for(nb, lambda d: not question(d), "Stay again")
                else:
                    nb.find_element(By.ID, "switch-account-confirm").click()
                    wait_ready(nb, "mallory")
                    check(signed_in_as(nb) == "mallory", "Switch signs the browser in to mallory")
            nb.quit()
            drivers.remove(nb)

        for name, function in chain[:last_chain + 1]:
            test(name, locals()[function])
        for name, function in alone:
            if matches(name):
                test(name, locals()[function])
    finally:
        quit_all(drivers)
        server.stop()
        if os.environ.get("KEEP"):
            print(f"kept {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)
    failed = [name for name, ok in results if not ok]
    print(f"{len(results) - len(failed)} of {len(results)} browser tests passed in {time.monotonic() - started:.1f} s")
    # With -k, choosing none of these tests is fine (the TEXT may name another suite's file).
    return 1 if failed or (not results and not chosen) else 0


if __name__ == "__main__":
    sys.exit(main())
