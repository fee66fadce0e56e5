#!/usr/bin/env python3
"""Browser tests for the web client and the share page (issue 15).

Drives headless Debian Chromium (Selenium + chromedriver) against a real `lattice serve` on 127.0.0.1
with the package's Web/ directory, and the `lattice` CLI for alice. Run through Scripts/browser-tests.sh,
which installs what is missing. Every wait is bounded; a failure prints what was on the page.

Environment: LATTICE_BIN (the lattice binary), LATTICE_WEB (the Web/ folder), SCREENSHOTS (a folder for
the PNG screenshots, e.g. Docs/images), KEEP (keep the temporary folder).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
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
    def __init__(self, directory):
        env = dict(os.environ, LATTICE_WEB_ROOT=WEB)
        self.log = open(os.path.join(directory, "server.log"), "wb")
        self.process = subprocess.Popen([LATTICE, "serve", "--data", os.path.join(directory, "data"), "--port", "0"],
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


def sign_up_through(driver, share_url, name):
    """Opens a share link signed out, signs up from it and comes back to it, then joins."""
    driver.get(share_url)
    wait_for(driver, lambda d: d.find_elements(By.LINK_TEXT, "Sign up to join"), "the share page offers sign-up")
    driver.find_element(By.LINK_TEXT, "Sign up to join").click()
    field = wait_for(driver, lambda d: d.find_element(By.ID, "signup-name"), "the sign-up page")
    field.send_keys(name)
    driver.find_element(By.CSS_SELECTOR, "#signup-form button[type=submit]").click()
    wait_for(driver, lambda d: "/share/" in d.current_url and d.find_elements(By.ID, "join"),
             f"{name} is back on the same share page with a Join button")
    check(driver.current_url == share_url, f"came back to {driver.current_url}, not the link")
    driver.find_element(By.ID, "join").click()
    wait_for(driver, lambda d: d.execute_script("return document.body.dataset.ready") == "true"
             and d.find_elements(By.CSS_SELECTOR, "#items li.item"), f"{name} sees the list's items after joining")


def act(action, tries=50):
    """Runs an interaction again when a live update replaced the element it found (bounded)."""
    for attempt in range(tries):
        try:
            return action()
        except StaleElementReferenceException:
            if attempt == tries - 1:
                raise
            time.sleep(0.05)


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


def main():
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

        bob, carol = browser(), browser()
        drivers.extend([bob, carol])

        def share_page_then_sign_up_and_join():
            bob.get(groceries)
            wait_for(bob, lambda d: d.find_element(By.ID, "title").text == "Groceries", "the share page shows the title")
            check(bob.find_element(By.ID, "owner").text == "Shared by alice", "who shared it")
            check(bob.find_element(By.ID, "access").text == "You can view and edit this list.", "the access in words")
            check(bob.find_element(By.ID, "count").text == "2 items", "how many items")
            check(f"lattice accept {groceries}" in page_text(bob), "the terminal command")
            screenshot(bob, "share-page.png")
            sign_up_through(bob, groceries, "bob")
            check(sorted(i[0] for i in items_on_page(bob)) == sorted(["Milk", XSS_ITEM]), f"bob's items: {items_on_page(bob)}")
            screenshot(bob, "list.png")
            bob.set_window_size(390, 844)
            screenshot(bob, "list-phone.png")
            bob.set_window_size(1100, 900)
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
            screenshot(fresh, "invalid-link.png")
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
            act(lambda: owner.find_element(By.ID, "new-list-title").send_keys("Picnic"))
            owner.find_element(By.CSS_SELECTOR, "#new-list button[type=submit]").click()
            wait_for(owner, lambda d: d.find_elements(By.ID, "list-title") and d.find_element(By.ID, "list-title").text == "Picnic",
                     "the new list opens")
            for text, tags in [("Plates", "paper, party"), ("Cups", "")]:
                act(lambda: owner.find_element(By.ID, "new-item").send_keys(text))
                act(lambda: owner.find_element(By.ID, "new-item-tags").send_keys(tags))
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
            act(lambda: wait_for(owner, lambda d: d.find_element(By.ID, "invite-name"), "the share panel").send_keys("erin"))
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
            wait_for(owner, lambda d: d.find_element(By.ID, "link-url").get_attribute("value").startswith(server.url + "/share/"),
                     "the link is shown")
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

        test("share link opened -> sign up -> join -> items shown", share_page_then_sign_up_and_join)
        test("user text shown as text, no dialog, no console errors or CSP violations", user_text_is_text)
        test("CSP, nosniff and Referrer-Policy headers; JSON for API clients", security_headers)
        test("read-only participant sees no edit controls; a forced write is refused", read_only_sees_no_edit_controls)
        test("concurrent edits from two browsers and the CLI converge to lattice list show --json", concurrent_edits_converge)
        test("a write refused by the server is rolled back on screen with its reason", refused_write_is_rolled_back)
        test("removal from the share takes the list off screen", removal_takes_the_list_off_screen)
        test("lattice login --web: the link signs a browser in once", sign_in_link_from_the_cli)
        test("the owner in the browser: lists, items, sharing panel; a deletion leaves a participant's screen",
             owner_in_the_browser)
        test("expired, tampered, used-up and made-up links show the friendly page", invalid_links_show_the_friendly_page)
    finally:
        for driver in drivers:
            try:
                driver.quit()
            except Exception:
                pass
        server.stop()
        if os.environ.get("KEEP"):
            print(f"kept {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)
    failed = [name for name, ok in results if not ok]
    print(f"{len(results) - len(failed)} of {len(results)} browser tests passed in {time.monotonic() - started:.1f} s")
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
