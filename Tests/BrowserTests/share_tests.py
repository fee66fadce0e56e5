#!/usr/bin/env python3
"""Browser tests of short share links and the share page (issue 30: links that do not break).

The owner shares a list from the CLI; a person opens the short link (`/s/{code}`) in Chromium, with and
without the punctuation a message leaves after it, lands on the share page of the signed link, finds the
`lattice accept` command folded behind "Join from a terminal" (with the short link in it), signs up from
there and joins; a rotated short link shows the same invalid-link page as the long one. Desktop and phone
sizes, with the page's accessibility checks. Run through Scripts/browser-tests.sh.
"""
import os
import shutil
import sys
import tempfile
import urllib.parse

from selenium.webdriver.common.by import By

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import browser_tests as bt  # noqa: E402
from browser_tests import check, wait_for  # noqa: E402


def main():
    directory = tempfile.mkdtemp(prefix="lattice-share-")
    server = bt.Server(directory)
    driver = None
    results = []
    try:
        owner = bt.CLI(os.path.join(directory, "olga"))
        owner.run("signup", "olga", "--server", server.url)
        owner.run("list", "create", "Picnic")
        for item in ["Bread", "Cheese", "Grapes"]:
            owner.run("list", "add", "Picnic", item)
        owner.run("share", "create", "Picnic", "--public-permission", "read-write")
        link = owner.json("share", "url", "Picnic")
        long_url, short_url = link["url"], link["shortURL"]
        code = short_url.rsplit("/", 1)[1]
        driver = bt.browser()

        def terminal(d):
            return d.find_element(By.CSS_SELECTOR, "details.terminal")

        def the_short_link_opens_the_share_page_with_the_command_folded():
            check(short_url.startswith(server.url + "/s/") and len(code) == 10 and len(short_url) < 60,
                  f"a short link: {short_url} (the long one has {len(long_url)} characters)")
            driver.get(short_url)
            wait_for(driver, lambda d: d.find_elements(By.ID, "title") and d.find_element(By.ID, "title").text == "Picnic",
                     "the share page of the list")
            check(driver.current_url == long_url + "?via=" + code, f"on the signed link's page: {driver.current_url}")
            check("3 items" in bt.page_text(driver), bt.page_text(driver))
            details = terminal(driver)
            summary = details.find_element(By.TAG_NAME, "summary")
            command = details.find_element(By.TAG_NAME, "code")
            check(summary.text == "Join from a terminal", summary.text)
            check(details.get_attribute("open") is None and not command.is_displayed(), "folded at first")
            summary.click()
            wait_for(driver, lambda d: command.is_displayed(), "the command shows once opened")
            check(command.text == "lattice accept " + short_url, f"the short link in the command: {command.text!r}")
            status, found, _ = bt.headers(short_url)
            check(status == 200 and "script-src 'self'" in found.get("Content-Security-Policy", ""),
                  f"the page after the redirect keeps its CSP: {status} {found.get('Content-Security-Policy')}")
            check(not bt.console_problems(driver), f"console: {bt.console_problems(driver)}")
            bt.check_accessibility(driver, "share page from a short link")

        def punctuation_after_the_short_link_does_not_break_it():
            for tail in [".", ")", ").", "!", "?", ",", "'", "%22", "%3E", "/"]:
                driver.get(short_url + tail)
                wait_for(driver, lambda d: d.find_elements(By.ID, "title") and d.find_element(By.ID, "title").text == "Picnic",
                         f"the short link with {tail!r} after it opens the share page")
            driver.get(server.url + "/s/" + code.upper())
            wait_for(driver, lambda d: d.find_elements(By.ID, "title"), "a code typed in capitals opens it too")

        def on_a_phone_the_folded_command_takes_one_line():
            bt.phone(driver, True)
            try:
                driver.get(short_url)
                wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "details.terminal"), "the share page on a phone")
                closed = terminal(driver).rect["height"]
                check(closed < 60, f"the folded command is {closed} px high")
                actions = driver.find_element(By.ID, "signin-actions")
                check(actions.rect["y"] + actions.rect["height"] <= 844, f"sign-up shows without scrolling: {actions.rect}")
                bt.check_accessibility(driver, "share page from a short link", phone=True)
                terminal(driver).find_element(By.TAG_NAME, "summary").click()
                wait_for(driver, lambda d: terminal(d).rect["height"] > closed, "it opens")
                bt.check_accessibility(driver, "share page, command open", phone=True)
            finally:
                bt.phone(driver, False)

        def a_person_signs_up_from_the_short_link_and_joins():
            bt.signed_out(driver)
            driver.get(short_url + ".")
            wait_for(driver, lambda d: d.find_elements(By.LINK_TEXT, "Sign up to join"), "the share page offers sign-up")
            driver.find_element(By.LINK_TEXT, "Sign up to join").click()
            field = wait_for(driver, lambda d: d.find_element(By.ID, "signup-name"), "the sign-up page")
            field.send_keys("pia")
            driver.find_element(By.CSS_SELECTOR, "#signup-form button[type=submit]").click()
            bt.save_recovery_codes(driver)
            wait_for(driver, lambda d: d.current_url.startswith(long_url) and d.find_elements(By.ID, "join"),
                     "back on the share page with a Join button")
            driver.find_element(By.ID, "join").click()
            wait_for(driver, lambda d: d.execute_script("return document.body.dataset.ready") == "true"
                     and len(d.find_elements(By.CSS_SELECTOR, "#items li.item")) == 3, "pia sees the list's three items")
            roster = owner.run("share", "participants", "Picnic")
            check("pia" in roster, f"the owner sees pia: {roster}")

        def a_rotated_short_link_shows_the_invalid_link_page():
            owner.run("share", "url", "Picnic", "--rotate")
            bt.signed_out(driver)
            pages = []
            for url in [short_url, long_url]:
                driver.get(url)
                wait_for(driver, lambda d: d.find_elements(By.TAG_NAME, "h1"), f"a page for {url[:50]}")
                pages.append(bt.page_text(driver))
            check(pages[0] == pages[1] and "This link does not work" in pages[0], f"the same page: {pages}")
            status, _, body = bt.headers(short_url, accept="application/json")
            check(status == 403 and "ACCESS_DENIED" in body and "invalid, expired or revoked" in body, f"{status} {body}")
            bad = server.url + "/s/" + urllib.parse.quote("<script>", safe="")
            driver.get(bad)
            wait_for(driver, lambda d: "This link does not work" in bt.page_text(d), "a made-up code: the same page")

        results = bt.run_suite("share", [
            ("the short link opens the share page with the command folded", the_short_link_opens_the_share_page_with_the_command_folded),
            ("punctuation after the short link does not break it", punctuation_after_the_short_link_does_not_break_it),
            ("on a phone the folded command takes one line", on_a_phone_the_folded_command_takes_one_line),
            ("a person signs up from the short link and joins", a_person_signs_up_from_the_short_link_and_joins),
            ("a rotated short link shows the invalid-link page", a_rotated_short_link_shows_the_invalid_link_page)])
    finally:
        if driver:
            driver.quit()
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)
    print(f"{sum(results)} of {len(results)} share tests passed")
    return 0 if results and all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
