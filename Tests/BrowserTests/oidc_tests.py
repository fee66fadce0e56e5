#!/usr/bin/env python3
"""Browser tests of sign-in through an OpenID Connect provider (issue 30).

A real provider (Tests/OIDCProvider/provider.py on joserfc, through Scripts/oidc-provider.sh) and
`lattice serve --oidc-issuer ... --oidc-client-id ...`, both on 127.0.0.1: the sign-in page offers the
provider, the browser goes there and back (authorization code with PKCE) and lands signed in; signed out, it
signs in again as the same account; a callback replayed or carried to another browser is refused; a person
from a share link comes back to it. Run through Scripts/browser-tests.sh.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from selenium.webdriver.common.by import By

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import browser_tests as bt  # noqa: E402
from browser_tests import check, wait_for  # noqa: E402

ROOT = bt.ROOT


class Provider:
    def __init__(self, directory):
        url_file = os.path.join(directory, "issuer")
        self.process = subprocess.Popen(["bash", os.path.join(ROOT, "Scripts", "oidc-provider.sh"), "--url-file", url_file,
                                         "--client-id", "lattice-web"], stdout=subprocess.DEVNULL, cwd=ROOT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not os.path.exists(url_file):
            check(self.process.poll() is None, "the provider exited")
            time.sleep(0.05)
        with open(url_file) as handle:
            self.issuer = handle.read().strip()

    def get(self, path):
        with urllib.request.urlopen(self.issuer + path, timeout=10) as reply:
            return reply.read().decode()

    def stop(self):
        self.process.kill()
        self.process.wait(timeout=10)


def main():
    directory = tempfile.mkdtemp(prefix="lattice-oidc-")
    provider = Provider(directory)
    server = bt.Server(directory, ["--oidc-issuer", provider.issuer, "--oidc-client-id", "lattice-web"])
    results, drivers = [], []

    def new_browser():
        driver = bt.browser()
        drivers.append(driver)
        return driver

    def sign_in_through_the_provider(driver):
        driver.get(server.url + "/")
        button = wait_for(driver, lambda d: d.find_element(By.ID, "provider-0"), "the provider's button")
        check("127.0.0.1" in button.text, f"the button names the provider: {button.text!r}")
        button.click()

    try:
        first = new_browser()

        def a_first_sign_in_makes_the_account_and_lands_signed_in():
            provider.get("/test/user?sub=oidc-1&preferred_username=otto&name=Otto")
            sign_in_through_the_provider(first)
            bt.wait_ready(first, "otto")

        def signed_out_the_same_person_signs_in_as_the_same_account():
            first.find_element(By.ID, "signout").click()
            wait_for(first, lambda d: d.find_elements(By.ID, "provider-0"), "signed out: the sign-in page")
            sign_in_through_the_provider(first)
            bt.wait_ready(first, "otto")
            check(first.find_element(By.ID, "who").text == "otto", "not a second account")

        def another_person_with_the_same_name_gets_their_own_account():
            provider.get("/test/user?sub=oidc-2&preferred_username=otto")
            other = new_browser()
            sign_in_through_the_provider(other)
            bt.wait_ready(other, "otto-2")

        def a_callback_carried_to_another_browser_is_refused():
            # The provider's redirect back, caught before the browser follows it, opened in another browser:
            # the sign-in is bound to the browser that started it (its cookie).
            provider.get("/test/user?sub=oidc-3&preferred_username=mallory")
            start = json.loads(urllib.request.urlopen(server.url + "/auth/oidc/providers", timeout=10).read())["providers"][0]["start"]

            class NoRedirect(urllib.request.HTTPRedirectHandler):
                def redirect_request(self, *args, **kwargs):
                    return None
            opener = urllib.request.build_opener(NoRedirect)
            # A program (no text/html in Accept) gets the provider's URL as JSON; a browser would get a 303.
            authorize = json.loads(opener.open(server.url + start, timeout=10).read())["location"]
            try:
                opener.open(authorize, timeout=10)
            except urllib.error.HTTPError as redirect:
                callback = redirect.headers["Location"]
            victim = new_browser()
            victim.get(callback)
            wait_for(victim, lambda d: d.find_elements(By.ID, "reason"), "the failure page")
            check("another browser" in victim.find_element(By.ID, "reason").text, victim.find_element(By.ID, "reason").text)
            victim.get(server.url + "/")
            wait_for(victim, lambda d: d.find_elements(By.ID, "provider-0"), "the victim is still signed out")
            # And the same callback again (replayed) is unknown: taken once.
            victim.get(callback)
            wait_for(victim, lambda d: "unknown, used or expired" in d.find_element(By.ID, "reason").text, "a replay is refused")

        def a_person_from_a_share_link_comes_back_to_it():
            owner = bt.CLI(os.path.join(directory, "una"))
            owner.run("signup", "una", "--server", server.url)
            owner.run("list", "create", "Garden")
            owner.run("share", "create", "Garden", "--public-permission", "read-write")
            link = owner.run("share", "url", "Garden")
            provider.get("/test/user?sub=oidc-4&preferred_username=vera")
            visitor = new_browser()
            visitor.get(link)
            wait_for(visitor, lambda d: d.find_elements(By.LINK_TEXT, "Sign in"), "the share page offers sign-in")
            visitor.find_element(By.LINK_TEXT, "Sign in").click()
            wait_for(visitor, lambda d: d.find_element(By.ID, "provider-0"), "the sign-in page").click()
            wait_for(visitor, lambda d: d.current_url == link and d.find_elements(By.ID, "join"), "back on the share page")

        tests = [("a first sign-in makes the account and lands signed in", a_first_sign_in_makes_the_account_and_lands_signed_in),
                 ("signed out, the same person signs in as the same account", signed_out_the_same_person_signs_in_as_the_same_account),
                 ("another person with the same name gets their own account", another_person_with_the_same_name_gets_their_own_account),
                 ("a callback carried to another browser is refused", a_callback_carried_to_another_browser_is_refused),
                 ("a person from a share link comes back to it", a_person_from_a_share_link_comes_back_to_it)]
        results = bt.run_suite("oidc", tests)
    finally:
        bt.quit_all(drivers)
        server.stop()
        provider.stop()
        if not os.environ.get("KEEP"):
            shutil.rmtree(directory, ignore_errors=True)
    print(f"{sum(results)} of {len(results)} OpenID Connect tests passed")
    return 0 if results and all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
