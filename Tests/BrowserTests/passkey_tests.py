#!/usr/bin/env python3
"""Browser tests of passkeys and recovery codes (issue 30: a person who joined from a link can come back).

WebDriver's virtual authenticator stands in for a phone's or a laptop's: sign up with a passkey, sign out,
sign in again with it; sign in on a second browser profile with the same passkey (exported from the first
authenticator and added to the second, as a synced passkey would be); a recovery code signs in once and
never again; the account page adds and removes a passkey. The server runs with --public-url
http://localhost:PORT, because browsers take no IP address as a WebAuthn RP ID. Run through
Scripts/browser-tests.sh (the environment of browser_tests.py, whose helpers it uses).
"""
import os
import shutil
import socket
import sys
import tempfile
import time

from selenium.webdriver.common.by import By
from selenium.webdriver.common.virtual_authenticator import VirtualAuthenticatorOptions

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import browser_tests as bt  # noqa: E402
from browser_tests import check, wait_for  # noqa: E402


def localhost_server(directory):
    """`lattice serve` on 127.0.0.1 whose public URL is http://localhost:PORT (a WebAuthn RP ID)."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    server = bt.Server(directory, ["--public-url", f"http://localhost:{port}"], port=port)
    server.url = f"http://localhost:{port}"
    return server


def with_authenticator(driver):
    driver.add_virtual_authenticator(VirtualAuthenticatorOptions(
        protocol=VirtualAuthenticatorOptions.Protocol.CTAP2, transport=VirtualAuthenticatorOptions.Transport.INTERNAL,
        has_resident_key=True, has_user_verification=True, is_user_consenting=True, is_user_verified=True))
    return driver


def status(driver):
    return driver.find_element(By.ID, "status").text


def save_codes(driver):
    """The recovery codes step after a sign-up: returns the codes, ticks 'I saved these', continues."""
    wait_for(driver, lambda d: d.find_elements(By.ID, "recovery-code-list"), "the recovery codes are shown")
    codes = [c.text for c in driver.find_elements(By.CSS_SELECTOR, "#recovery-code-list code")]
    check(len(codes) == 10 and all(len(c) == 14 for c in codes), f"ten codes: {codes}")
    check(not driver.find_element(By.ID, "recovery-continue").is_enabled(), "Continue waits for 'I saved these codes'")
    driver.find_element(By.ID, "recovery-saved").click()
    driver.find_element(By.ID, "recovery-continue").click()
    return codes


def main():
    directory = tempfile.mkdtemp(prefix="lattice-passkeys-")
    server = localhost_server(directory)
    results, drivers = [], []
    state = {}

    def new_browser(authenticator=True):
        driver = bt.browser()
        drivers.append(driver)
        return with_authenticator(driver) if authenticator else driver

    try:
        phone = new_browser()

        def sign_up_with_a_passkey():
            phone.get(server.url + "/")
            wait_for(phone, lambda d: d.find_element(By.ID, "signup-passkey").is_displayed(), "the passkey sign-up button")
            bt.shoot_both(phone, "signin")
            phone.find_element(By.ID, "signup-name").send_keys("pia")
            phone.find_element(By.ID, "signup-passkey").click()
            wait_for(phone, lambda d: d.find_elements(By.ID, "recovery-code-list"), "the recovery codes are shown")
            bt.shoot_both(phone, "recovery-codes")
            state["codes"] = save_codes(phone)
            bt.wait_ready(phone, "pia")
            check(len(phone.get_credentials()) == 1, "the authenticator holds one passkey")

        def sign_out_and_in_again_with_the_passkey():
            phone.find_element(By.ID, "signout").click()
            wait_for(phone, lambda d: d.find_elements(By.ID, "signin-passkey"), "signed out: the sign-in page")
            phone.find_element(By.ID, "signin-passkey").click()
            bt.wait_ready(phone, "pia")

        def a_second_browser_profile_signs_in_with_the_same_passkey():
            exported = phone.get_credentials()
            laptop = new_browser()
            laptop.add_credential(exported[0])
            laptop.get(server.url + "/")
            wait_for(laptop, lambda d: d.find_element(By.ID, "signin-passkey").is_displayed(), "the sign-in page")
            laptop.find_element(By.ID, "signin-passkey").click()
            bt.wait_ready(laptop, "pia")

        def a_browser_without_the_passkey_is_told_so():
            stranger = new_browser()
            stranger.get(server.url + "/")
            wait_for(stranger, lambda d: d.find_element(By.ID, "signin-passkey").is_displayed(), "the sign-in page")
            stranger.find_element(By.ID, "signin-passkey").click()
            wait_for(stranger, lambda d: "No passkey was used" in status(d) or "not registered" in status(d),
                     "the page says no passkey signed in")
            check("error" in stranger.find_element(By.ID, "status").get_attribute("class"), "shown as an error")

        def a_recovery_code_signs_in_once_and_never_again():
            code = state["codes"][0]
            first = new_browser(authenticator=False)
            first.get(server.url + "/")
            first.find_element(By.CSS_SELECTOR, "#recovery summary").click()
            first.find_element(By.ID, "recovery-code").send_keys(code.lower())
            first.find_element(By.ID, "recovery-button").click()
            bt.wait_ready(first, "pia")
            wait_for(first, lambda d: "9 left" in d.find_element(By.ID, "notice").text, "the page says how many codes are left")
            state["recovered"] = first
            second = new_browser(authenticator=False)
            second.get(server.url + "/")
            second.find_element(By.CSS_SELECTOR, "#recovery summary").click()
            second.find_element(By.ID, "recovery-code").send_keys(code)
            second.find_element(By.ID, "recovery-button").click()
            wait_for(second, lambda d: "unknown or was used already" in status(d), "the used code is refused")
            check("/web/" not in second.current_url and not second.find_elements(By.ID, "who"), "still signed out")

        def the_account_page_adds_and_removes_a_passkey():
            tablet = state["recovered"]
            with_authenticator(tablet)
            tablet.find_element(By.ID, "account-link").click()
            wait_for(tablet, lambda d: d.execute_script("return document.body.dataset.ready") == "true", "the account page")
            rows = lambda d: d.find_elements(By.CSS_SELECTOR, "#passkeys li")
            check(len(rows(tablet)) == 1, "one passkey listed")
            check("9 unused recovery codes" in tablet.find_element(By.ID, "codes-left").text, "nine codes left")
            tablet.find_element(By.ID, "add-passkey").click()
            wait_for(tablet, lambda d: len(rows(d)) == 2, "the tablet's passkey is listed")
            remove = tablet.find_element(By.ID, "remove-1")
            check("Remove passkey" in remove.get_attribute("aria-label"), "the button names the passkey")
            remove.click()
            check("press again" in remove.text.lower(), "a second press confirms")
            remove.click()
            wait_for(tablet, lambda d: len(rows(d)) == 1, "the passkey is removed")
            # New recovery codes: the old ones stop working.
            tablet.find_element(By.ID, "new-codes").click()
            tablet.find_element(By.ID, "new-codes").click()
            fresh = save_codes(tablet)
            check(set(fresh).isdisjoint(state["codes"]), "a new set")
            state["codes"] = fresh
            bt.shoot_both(tablet, "account")

        def a_passkey_sign_up_from_a_share_link_comes_back_to_it():
            owner = bt.CLI(os.path.join(directory, "quinn"))
            owner.run("signup", "quinn", "--server", server.url)
            owner.run("list", "create", "Picnic")
            owner.run("list", "add", "Picnic", "Bread")
            owner.run("share", "create", "Picnic", "--public-permission", "read-write")
            link = owner.run("share", "url", "Picnic")
            visitor = new_browser()
            visitor.get(link)
            wait_for(visitor, lambda d: d.find_elements(By.LINK_TEXT, "Sign up to join"), "the share page offers sign-up")
            visitor.find_element(By.LINK_TEXT, "Sign up to join").click()
            field = wait_for(visitor, lambda d: d.find_element(By.ID, "signup-name"), "the sign-up page")
            field.send_keys("rae")
            visitor.find_element(By.ID, "signup-passkey").click()
            save_codes(visitor)
            wait_for(visitor, lambda d: d.current_url == link and d.find_elements(By.ID, "join"), "back on the share page")
            # Joined, then left: the page says "Left", not "Deleted".
            visitor.find_element(By.ID, "join").click()
            leave = wait_for(visitor, lambda d: d.find_element(By.ID, "leave"), "the list opens with Leave")
            leave.click()
            wait_for(visitor, lambda d: d.find_element(By.ID, "leave"), "Leave asks again").click()
            wait_for(visitor, lambda d: "Left “Picnic”." in d.find_element(By.ID, "notice").text, "the notice says Left")

        tests = [("sign up with a passkey", sign_up_with_a_passkey),
                 ("sign out and in again with the passkey", sign_out_and_in_again_with_the_passkey),
                 ("a second browser profile signs in with the same passkey", a_second_browser_profile_signs_in_with_the_same_passkey),
                 ("a browser without the passkey is told so", a_browser_without_the_passkey_is_told_so),
                 ("a recovery code signs in once and never again", a_recovery_code_signs_in_once_and_never_again),
                 ("the account page adds and removes a passkey", the_account_page_adds_and_removes_a_passkey),
                 ("a passkey sign-up from a share link comes back to it", a_passkey_sign_up_from_a_share_link_comes_back_to_it)]
        results = bt.run_suite("passkeys", tests)
    finally:
        bt.quit_all(drivers)
        server.stop()
        if not os.environ.get("KEEP"):
            shutil.rmtree(directory, ignore_errors=True)
    print(f"{sum(results)} of {len(results)} passkey tests passed")
    return 0 if results and all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
