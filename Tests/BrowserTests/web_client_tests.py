#!/usr/bin/env python3
"""Browser tests of the local-first web client (issue 30: points 2 to 6).

Headless Chromium against a real `lattice serve` on 127.0.0.1 (a fixed port, so the server can be stopped
and started again on the same address and data), with the `lattice` CLI for the other people:

- offline, on the phone layout (390 x 844): with the server stopped the page says so and counts what waits;
  adds, checks and edits show at once; a reload opens from the service worker with the lists, the waiting
  edits and a half-typed item; when the server is back the edits reach the CLI; edits the CLI made offline
  meanwhile merge with them (a later edit wins whatever order they arrive in; tags of both stay); an edit
  that lands on an item someone removed meanwhile is kept and can be brought back;
- concurrent edits: an open edit field whose item changed says so and asks before saving over it; an item
  removed while edited keeps the text and Restore brings it back; the caret stays put on live updates;
- the phone layout: quick-add on top, Back inside the app, checked items collapse and clear, undo of remove
  and un-tag, who changed an item and when, per-item announcements, unique control names, the skip link,
  the title and the h1;
- photos: a PNG attached to an item through its file input (after an attempt the server cannot take, which
  says so) shows as a thumbnail that loads, for paula after a reload and for oscar in his own browser; a
  thumbnail whose URL fails is asked for again; Undo of a removal brings the photo back;
- sharing: a short link made and turned off, invite-only with consent, the invite field clears, members
  and their access, stop sharing, pending invitations;
- screenshots of each page at 1280 x 800 and 390 x 844 (Docs/images/client-*.png), each checked for names,
  contrast and sideways scrolling first.

Run through Scripts/browser-tests.sh (the environment of browser_tests.py, whose helpers it uses).
"""
import os
import shutil
import socket
import struct
import sys
import tempfile
import time
import urllib.request
import zlib

from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import browser_tests as bt  # noqa: E402
from browser_tests import check, wait_for  # noqa: E402


def free_port():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return port


def body_data(driver, key):
    return driver.execute_script("return document.body && document.body.dataset[arguments[0]]", key)


def pending(driver):
    return int(body_data(driver, "pending") or "0")


def connection_text(driver):
    box = driver.find_element(By.ID, "connection")
    return box.text if box.is_displayed() else ""


def item_id(driver, text):
    return bt.item_row(driver, text).get_attribute("data-item")


def item_meta(driver, text):
    return bt.item_row(driver, text).find_element(By.CSS_SELECTOR, ".changed").text


def tool(driver, text, kind):
    """An item's Edit, + Tag or Remove button; on a phone its tools open from the row's ⋯ button first."""
    ident = item_id(driver, text)
    button = driver.find_element(By.ID, f"{kind}-{ident}")
    if not button.is_displayed():
        driver.find_element(By.ID, f"more-{ident}").click()
        wait_for(driver, lambda d: d.find_element(By.ID, f"{kind}-{ident}").is_displayed(), f"the tools of {text!r} open")
    return driver.find_element(By.ID, f"{kind}-{ident}")


def edit_text(driver, text, new_text):
    bt.act(lambda: tool(driver, text, "edit").click())
    field = wait_for(driver, lambda d: d.find_element(By.ID, "edit-input"), "the edit field")
    field.clear()
    field.send_keys(new_text, Keys.ENTER)
    wait_for(driver, lambda d: new_text in [i[0] for i in bt.items_on_page(d)], f"{new_text!r} shows")


def quick_add(driver, text):
    bt.type_into(driver, "new-item", text)
    driver.find_element(By.ID, "new-item").send_keys(Keys.ENTER)
    wait_for(driver, lambda d: text in [i[0] for i in bt.items_on_page(d)], f"{text!r} is added")


def open_list(driver, title):
    """Opens a list from the lists; on a phone showing another list, ‹ Lists first."""
    back = driver.find_elements(By.ID, "back-to-lists")
    if back and back[0].is_displayed() and not driver.find_element(By.ID, "lists").is_displayed():
        back[0].click()
        wait_for(driver, lambda d: d.find_element(By.ID, "lists").is_displayed(), "the lists")
    bt.open_list(driver, title)


def checkbox(driver, text):
    return bt.item_row(driver, text).find_element(By.CSS_SELECTOR, "input[type=checkbox]")


def shown(driver, text):
    rows = [r for r in driver.find_elements(By.CSS_SELECTOR, "#items li.item")
            if r.find_element(By.CSS_SELECTOR, "label.text").get_attribute("textContent") == text]
    return bool(rows) and rows[0].is_displayed()


def png(width, height, rgb):
    """A small PNG (8-bit RGB, one colour), made here: no image library needed."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def button_label(driver, ident):
    return driver.find_element(By.ID, f"photo-{ident}").get_attribute("aria-label")


def photo_loaded(driver, ident):
    """The width the item's thumbnail decoded to (0 while none has loaded), with its src and alt."""
    return driver.execute_script("""
        const img = document.getElementById('photo-image-' + arguments[0]);
        return img ? [img.complete ? img.naturalWidth : 0, img.getAttribute('src'), img.alt] : [0, null, null];""", ident)


def converge(driver, cli, title, timeout=bt.WAIT):
    """Waits until the page shows what `lattice list show` (after a sync) shows; returns it."""
    deadline = time.monotonic() + timeout
    while True:
        expected = sorted(bt.items_in_cli(cli, title))
        if sorted(bt.items_on_page(driver)) == expected:
            return expected
        if time.monotonic() > deadline:
            raise bt.Failure(f"not converged: cli {expected}, page {sorted(bt.items_on_page(driver))}")
        time.sleep(0.3)


# The accessible name of every control a person can reach, as browser_tests' accessibility check reads it.
NAMES_JS = r"""
const visible = (e) => e.getClientRects().length && getComputedStyle(e).visibility !== 'hidden' && !e.closest('[hidden]');
""" + bt.NAME_OF_JS + r"""
return [...document.querySelectorAll('button, input, select, textarea, a[href]')].filter(visible)
  .map((e) => [e.id, nameOf(e)]);
"""


# Seeded random edits by three replicas of the page's CRDT (Web/crdt.js) to one record, joined by the page
# in one order and in the reverse, and sent to the server (records/modify, forceUpdate of each state) in
# that shuffled order: the three must agree on the record, values and stamps alike.
JOIN_JS = r"""
const [seed, rounds, done] = arguments;
(async () => {
  const crdt = await import('/web/crdt.js');
  const session = await (await fetch('/auth/session')).json();
  const base = `/database/1/${session.container}/${session.environment}/private/`;
  const post = async (op, body) => {
    for (let attempt = 0; ; attempt += 1) { // the server's rate limit answers THROTTLED: wait as it says
      const reply = await (await fetch(base + op, { method: 'POST',
        headers: { 'X-Lattice-CSRF': session.csrfToken, 'Content-Type': 'application/json' }, body: JSON.stringify(body) })).json();
      if (reply.serverErrorCode !== 'THROTTLED' || attempt > 20) return reply;
      await new Promise((resolve) => setTimeout(resolve, (reply.retryAfter || 1) * 1000));
    }
  };
  let s = seed >>> 0;
  const rand = () => { s = (s + 0x6D2B79F5) >>> 0; let t = s; t = Math.imul(t ^ (t >>> 15), t | 1);
                       t ^= t + Math.imul(t ^ (t >>> 7), t | 61); return ((t ^ (t >>> 14)) >>> 0) / 4294967296; };
  const pick = (a) => a[Math.floor(rand() * a.length)];
  const stamp = (x) => x ? `${x.ms}.${x.counter}@${x.replica}` : null;
  const shape = (r) => {
    if (!r || r.serverErrorCode === 'NOT_FOUND' || r.deleted) return { deleted: true };
    const f = r.fields || {};
    const reg = (n) => f[n] ? [f[n].value ?? null, stamp(f[n].crdt && f[n].crdt.stamp)] : null;
    const tags = f.tags ? [[...f.tags.value].sort(), f.tags.crdt.entries.map((e) => `${e.value}:${stamp(e.stamp)}`).sort(),
                           f.tags.crdt.context.map(stamp).sort()] : null;
    return { deleted: false, generation: r.crdt.generation, text: reg('text'), done: reg('done'), tags };
  };
  const zoneID = { zoneName: 'Lists' };
  const failures = [];
  let sent = 0;
  for (let round = 0; round < rounds; round += 1) {
    const name = `join-${seed}-${round}`;
    const made = await post('records/modify', { zoneID, operations: [{ operationType: 'create', record: { recordName: name, recordType: 'Item',
      fields: { text: { value: 'base' }, done: { value: 0 }, tags: { value: ['a', 'b'], type: 'STRING_LIST' } } } }] });
    if (!made.records) { failures.push(`${name}: ${JSON.stringify(made)}`); continue; }
    const first = made.records[0];
    const replicas = [0, 1, 2].map(() => ({ clock: new crdt.Clock(crdt.newReplicaID()), view: first, states: [] }));
    for (const r of replicas) r.clock.observeRecord(first);
    const steps = 2 + Math.floor(rand() * 8);
    for (let i = 0; i < steps; i += 1) {
      const r = pick(replicas);
      if (r.view.deleted) continue; // a replica does not edit what it saw removed
      const kind = rand();
      let state;
      if (kind < 0.3) state = crdt.setFields(r.view, r.clock, { text: [pick(['x', 'y', 'z']), 'STRING'] });
      else if (kind < 0.45) state = crdt.setFields(r.view, r.clock, { done: [pick([0, 1]), 'INT64'] });
      else if (kind < 0.92) {
        const add = rand() < 0.6 ? [pick(['a', 'b', 'c', 'd'])] : [];
        const remove = rand() < 0.6 ? [pick(['a', 'b', 'c', 'd'])] : [];
        if (!add.length && !remove.length) continue;
        state = crdt.editSet(r.view, r.clock, 'tags', add, remove);
      } else state = crdt.deletion(r.view, r.clock);
      r.states.push(state);
      r.view = crdt.joinRecords(r.view, state);
      if (rand() < 0.3) { // it hears of another replica's edits
        const other = pick(replicas);
        for (const x of other.states) { r.view = crdt.joinRecords(r.view, x); r.clock.observeRecord(x); }
      }
    }
    const all = replicas.flatMap((r) => r.states);
    for (let i = all.length - 1; i > 0; i -= 1) { const j = Math.floor(rand() * (i + 1)); [all[i], all[j]] = [all[j], all[i]]; }
    let forward = first, backward = first;
    for (const state of all) forward = crdt.joinRecords(forward, state);
    for (const state of [...all].reverse()) backward = crdt.joinRecords(backward, state);
    for (const state of all) {
      const reply = await post('records/modify', { zoneID, operations: [{ operationType: 'forceUpdate', record: state }] });
      sent += 1;
      if (!reply.records) { failures.push(`${name}: ${JSON.stringify(reply)} for ${JSON.stringify(state)}`); continue; }
      if (reply.records[0].serverErrorCode) failures.push(`${name}: ${reply.records[0].serverErrorCode} ${reply.records[0].reason}`);
    }
    const looked = await post('records/lookup', { zoneID, records: [{ recordName: name }] });
    if (!looked.records) { failures.push(`${name}: lookup ${JSON.stringify(looked)}`); continue; }
    const server = looked.records[0];
    const [a, b, c] = [shape(forward), shape(backward), shape(server)].map((x) => JSON.stringify(x));
    if (a !== b || a !== c) failures.push(`${name}: page ${a} / reversed ${b} / server ${c}`);
  }
  done({ failures, sent });
})().catch((error) => done({ failures: ['script: ' + error] }));
"""


def main():
    directory = tempfile.mkdtemp(prefix="lattice-web-client-")
    port = free_port()
    server = bt.Server(directory, port=port)
    drivers = []
    results = []
    try:
        oscar = bt.CLI(os.path.join(directory, "oscar"))
        paula = bt.CLI(os.path.join(directory, "paula"))
        oscar.run("signup", "oscar", "--server", server.url)
        paula.run("signup", "paula", "--server", server.url)
        oscar.run("list", "create", "Market")
        for text in ["Milk", "Bread", "Apples", "Butter"]:
            oscar.run("list", "add", "Market", text)
        oscar.run("share", "create", "Market", "--public-permission", "read-write")
        paula.run("accept", oscar.run("share", "url", "Market"), "--yes")
        paula.run("list", "create", "Errands")
        paula.run("list", "add", "Errands", "Post office")

        pb = bt.browser()
        drivers.append(pb)
        bt.phone(pb, True)
        pb.get(paula.run("login", "--web"))
        bt.wait_ready(pb, "paula")
        wait_for(pb, lambda d: body_data(d, "offlineReady") == "true", "the service worker is ready")
        open_list(pb, "Market")
        wait_for(pb, lambda d: len(bt.items_on_page(d)) == 4, "Market's four items")
        state = {"server": server}

        def the_page_joins_as_the_server_does():
            seed = int(os.environ.get("SEED", str(int(time.time()) % 100000)))
            print(f"  seed {seed} (SEED={seed} repeats it)")
            found = pb.execute_async_script(JOIN_JS, seed, 25)
            check(not found["failures"], f"the page's join and the server's differ: {found['failures'][:3]}")
            print(f"  25 records, {found['sent']} states sent: the page's join, its reverse and the server's agree")

        # MARK: Offline

        def installable():
            manifest = pb.execute_cdp_cmd("Page.getAppManifest", {})
            check(manifest.get("url", "").endswith("/web/manifest.webmanifest") and not manifest.get("errors"),
                  f"the manifest: {manifest.get('url')} {manifest.get('errors')}")
            errors = pb.execute_cdp_cmd("Page.getInstallabilityErrors", {}).get("installabilityErrors", [])
            check(not errors, f"installability errors: {errors}")
            controlled = pb.execute_script("return !!navigator.serviceWorker.controller")
            check(controlled, "the page is controlled by the service worker")

        def offline_is_said_and_edits_show_at_once():
            state["server"].stop()
            wait_for(pb, lambda d: body_data(d, "online") == "false" and "Offline" in connection_text(d),
                     "the page says it is offline", timeout=15)
            # Meanwhile oscar's CLI, offline too, queues edits (made before paula's, so hers are later).
            oscar.run("list", "edit", "Market", "Apples", "--text", "Green apples", "--add-tag", "fruit", "--no-sync")
            oscar.run("list", "edit", "Market", "Milk", "--add-tag", "cold", "--no-sync")
            oscar.run("list", "add", "Market", "Cheese", "--no-sync")
            time.sleep(0.05)
            quick_add(pb, "Eggs")
            check(bt.items_on_page(pb)[0][0] == "Eggs", f"the new item is on top: {bt.items_on_page(pb)}")
            bt.act(lambda: checkbox(pb, "Milk").click())
            wait_for(pb, lambda d: [i for i in bt.items_on_page(d) if i[0] == "Milk"][0][1], "Milk is checked")
            edit_text(pb, "Bread", "Rye bread")
            edit_text(pb, "Apples", "Red apples")
            bt.act(lambda: tool(pb, "Milk", "tag").click())
            wait_for(pb, lambda d: d.find_element(By.ID, "tag-input"), "the tag field").send_keys("organic", Keys.ENTER)
            wait_for(pb, lambda d: ["Milk", True, ["organic"]] in bt.items_on_page(d), "Milk is tagged")
            wait_for(pb, lambda d: pending(d) == 5 and "5 changes wait" in connection_text(d),
                     f"five changes wait (the page says {connection_text(pb)!r})")
            check("not sent yet" in item_meta(pb, "Eggs"), f"Eggs says it is not sent: {item_meta(pb, 'Eggs')!r}")
            state["page"] = sorted(bt.items_on_page(pb))
            print(f"  offline page: {state['page']}")

        def reload_opens_from_the_service_worker():
            bt.type_into(pb, "new-item", "Jam")  # typed, not added: a draft
            pb.refresh()
            bt.wait_ready(pb, "paula")
            check(pb.execute_script("return !!navigator.serviceWorker.controller"), "opened by the service worker")
            wait_for(pb, lambda d: d.find_elements(By.ID, "list-title") and d.find_element(By.ID, "list-title").text == "Market",
                     "Market is open again")
            wait_for(pb, lambda d: sorted(bt.items_on_page(d)) == state["page"], "the waiting edits show after the reload")
            wait_for(pb, lambda d: "Offline" in connection_text(d) and pending(d) == 5, "offline, five changes wait")
            check(pb.find_element(By.ID, "new-item").get_attribute("value") == "Jam", "the half-typed item is kept")
            pb.back()
            wait_for(pb, lambda d: d.find_element(By.ID, "lists-heading").is_displayed()
                     and {"Market", "Errands"} <= {t.text for t in d.find_elements(By.CSS_SELECTOR, "#lists .list-link .title")},
                     "Back shows the lists, kept in the browser")
            open_list(pb, "Errands")
            quick_add(pb, "Stamps")
            wait_for(pb, lambda d: pending(d) == 6, "six changes wait")
            bt.shoot_both(pb, "client-offline")
            bt.phone(pb, True)
            open_list(pb, "Market")

        def back_online_the_edits_reach_the_cli():
            state["server"] = bt.Server(directory, port=port)
            wait_for(pb, lambda d: pending(d) == 0 and body_data(d, "online") == "true", "the waiting changes are sent", timeout=20)
            wait_for(pb, lambda d: not connection_text(d), "the page no longer says offline")
            seen = sorted(bt.items_in_cli(paula, "Market"))
            for expected in [["Eggs", False, []], ["Rye bread", False, []], ["Red apples", False, []], ["Milk", True, ["organic"]]]:
                check(expected in seen, f"paula's CLI lacks {expected}: {seen}")
            check(["Stamps", False, []] in bt.items_in_cli(paula, "Errands"), "the private list's item arrived too")
            print(f"  paula's CLI: {seen}")

        def offline_cli_edits_merge():
            oscar.run("sync")  # oscar's offline edits arrive after paula's
            merged = converge(pb, oscar, "Market")
            print(f"  merged: {merged}")
            check(["Milk", True, ["cold", "organic"]] in merged, f"both tags and the check on Milk: {merged}")
            check(["Red apples", False, ["fruit"]] in merged,
                  f"paula's later text wins over oscar's earlier one although his arrived last; his tag stays: {merged}")
            check(["Cheese", False, []] in merged and ["Eggs", False, []] in merged, f"both new items: {merged}")
            check(pb.find_element(By.ID, "new-item").get_attribute("value") == "Jam", "the draft is still there, not added")

        def an_edit_to_an_item_removed_meanwhile_is_kept():
            # paula's page cannot reach the server while she edits Butter; oscar removes Butter meanwhile.
            pb.execute_cdp_cmd("Network.enable", {})
            pb.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/database/*", "*/auth/session"]})
            try:
                edit_text(pb, "Butter", "Salted butter")
                wait_for(pb, lambda d: body_data(d, "online") == "false" and pending(d) == 1, "the edit waits")
                oscar.run("list", "remove", "Market", "Butter")
            finally:
                pb.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
            wait_for(pb, lambda d: pending(d) == 0 and "Salted butter" in d.find_element(By.ID, "undo-text").text,
                     "the page says the item was removed and offers to bring it back", timeout=20)
            check(not any(i[0] in ("Salted butter", "Butter") for i in bt.items_on_page(pb)), "the removal won")
            pb.find_element(By.ID, "undo-button").click()
            wait_for(pb, lambda d: ["Salted butter", False, []] in bt.items_on_page(d), "brought back with the text")
            wait_for(pb, lambda d: pending(d) == 0, "sent")
            check(["Salted butter", False, []] in bt.items_in_cli(oscar, "Market"), "oscar sees it back")

        # MARK: Concurrent edits

        def a_cli_change_arrives_on_the_push_stream():
            # The page holds a push stream (an EventSource on its push token's /push/ URL; body[data-push] says
            # so) instead of a parked long poll, and a change the CLI makes shows without a reload.
            wait_for(pb, lambda d: body_data(d, "push") == "on", "the page's push stream is open")
            oscar.run("list", "add", "Market", "Pears")
            wait_for(pb, lambda d: ["Pears", False, []] in bt.items_on_page(d), "oscar's item shows without a reload")
            oscar.run("list", "remove", "Market", "Pears")
            wait_for(pb, lambda d: not any(i[0] == "Pears" for i in bt.items_on_page(d)), "and its removal")

        def stale_edit_field_asks_before_saving():
            bt.phone(pb, False)
            bt.act(lambda: tool(pb, "Eggs", "edit").click())
            field = wait_for(pb, lambda d: d.find_element(By.ID, "edit-input"), "the edit field")
            field.clear()
            field.send_keys("Free-range eggs")
            pb.execute_script("const f = arguments[0]; f.setSelectionRange(4, 4); f.dataset.marker = 'kept';", field)
            oscar.run("list", "edit", "Market", "Eggs", "--text", "Brown eggs")
            note = wait_for(pb, lambda d: d.find_element(By.ID, "edit-note") if d.find_element(By.ID, "edit-note").is_displayed() else None,
                            "the field says the item changed")
            check("oscar" in note.text and "Brown eggs" in note.text, f"who and what: {note.text!r}")
            field = pb.find_element(By.ID, "edit-input")
            check(field.get_attribute("value") == "Free-range eggs", "the person's text stays in the field")
            check(field.get_attribute("data-marker") == "kept" and pb.execute_script("return arguments[0].selectionStart", field) == 4,
                  "the field was not rebuilt and the caret stayed put")
            pb.find_element(By.ID, "edit-save").click()
            time.sleep(0.5)
            check(pb.find_elements(By.ID, "edit-form"), "the first Save asks instead of saving")
            check(pb.find_element(By.ID, "edit-save").text == "Replace their text", pb.find_element(By.ID, "edit-save").text)
            check(["Brown eggs", False, []] in bt.items_in_cli(oscar, "Market"), "nothing overwritten yet")
            pb.find_element(By.ID, "edit-save").click()
            wait_for(pb, lambda d: not d.find_elements(By.ID, "edit-form"), "the second Save saves")
            wait_for(pb, lambda d: pending(d) == 0, "sent")
            check(["Free-range eggs", False, []] in bt.items_in_cli(oscar, "Market"), "saved on purpose")

        def untouched_field_follows_and_use_their_text():
            bt.act(lambda: tool(pb, "Cheese", "edit").click())
            wait_for(pb, lambda d: d.find_element(By.ID, "edit-input"), "the edit field")
            oscar.run("list", "edit", "Market", "Cheese", "--text", "Goat cheese")
            wait_for(pb, lambda d: d.find_element(By.ID, "edit-input").get_attribute("value") == "Goat cheese",
                     "an untouched field takes the new text")
            field = pb.find_element(By.ID, "edit-input")
            field.clear()
            field.send_keys("Blue cheese")
            oscar.run("list", "edit", "Market", "Goat cheese", "--text", "Feta")
            wait_for(pb, lambda d: d.find_element(By.ID, "edit-theirs").is_displayed(), "Use their text is offered")
            pb.find_element(By.ID, "edit-theirs").click()
            check(pb.find_element(By.ID, "edit-input").get_attribute("value") == "Feta", "their text in the field")
            pb.find_element(By.ID, "edit-cancel").click()

        def removed_while_edited_keeps_the_text():
            bt.act(lambda: tool(pb, "Rye bread", "edit").click())
            field = wait_for(pb, lambda d: d.find_element(By.ID, "edit-input"), "the edit field")
            field.clear()
            field.send_keys("Sourdough")
            oscar.run("list", "remove", "Market", "Rye bread")
            wait_for(pb, lambda d: d.find_element(By.ID, "edit-note").is_displayed()
                     and "removed" in d.find_element(By.ID, "edit-note").text, "the field says the item was removed")
            check(pb.find_element(By.ID, "edit-input").get_attribute("value") == "Sourdough", "the text is kept")
            check(pb.find_element(By.ID, "edit-save").text == "Restore", "Restore is offered")
            pb.find_element(By.ID, "edit-save").click()
            wait_for(pb, lambda d: ["Sourdough", False, []] in bt.items_on_page(d) and pending(d) == 0, "restored")
            check(["Sourdough", False, []] in bt.items_in_cli(oscar, "Market"), "oscar sees it again")

        def caret_stays_put_on_live_updates():
            bt.type_into(pb, "new-item", "Tomatoes")
            field = pb.find_element(By.ID, "new-item")
            pb.execute_script("arguments[0].setSelectionRange(3, 3); arguments[0].dataset.marker = 'kept';", field)
            oscar.run("list", "check", "Market", "Feta")
            oscar.run("list", "add", "Market", "Onions")
            wait_for(pb, lambda d: "Onions" in [i[0] for i in bt.items_on_page(d)], "oscar's item arrives")
            field = pb.find_element(By.ID, "new-item")
            check(field.get_attribute("data-marker") == "kept", "the field is the same element")
            check(pb.execute_script("return [document.activeElement.id, arguments[0].selectionStart]", field) == ["new-item", 3],
                  "the focus and the caret stayed put")
            field.send_keys(Keys.ENTER)
            wait_for(pb, lambda d: "Tomatoes" in [i[0] for i in bt.items_on_page(d)], "and the item adds")

        # MARK: Phone layout

        def quick_add_is_on_top():
            bt.phone(pb, True)
            top = pb.find_element(By.ID, "add-item").rect["y"]
            first = pb.find_elements(By.CSS_SELECTOR, "#items li.item")[0].rect["y"]
            check(top < first, f"the add field ({top}) is above the items ({first})")
            check(top < 400, f"the add field is on the first screen: y={top}")
            quick_add(pb, "Basil")
            check(bt.items_on_page(pb)[0][0] == "Basil", "the new item shows on top")
            check(pb.execute_script("return document.activeElement.id") == "new-item", "the field keeps the focus")
            rows = pb.find_elements(By.CSS_SELECTOR, "#items li.item .item-row")
            heights = [r.rect["height"] for r in rows if r.is_displayed()]
            check(max(heights) < 90, f"one row per item: heights {heights}")

        def back_stays_in_the_app():
            start = pb.current_url
            pb.find_element(By.ID, "share-button").click()
            wait_for(pb, lambda d: d.find_elements(By.ID, "share-panel"), "the share panel")
            check(pb.title == "Share Market · Lattice", pb.title)
            pb.back()
            wait_for(pb, lambda d: not d.find_elements(By.ID, "share-panel") and d.find_element(By.ID, "items").is_displayed(),
                     "Back closes the share panel")
            check(pb.current_url == start, pb.current_url)
            pb.back()
            wait_for(pb, lambda d: d.find_element(By.ID, "lists").is_displayed() and not d.find_element(By.ID, "main").is_displayed(),
                     "Back shows the lists (the whole screen on a phone)")
            check(pb.title == "Lists · Lattice" and pb.current_url.startswith(state["server"].url), f"{pb.title} {pb.current_url}")
            pb.forward()
            wait_for(pb, lambda d: d.find_element(By.ID, "list-title").is_displayed() and d.title == "Market · Lattice", "Forward reopens it")
            pb.find_element(By.ID, "back-to-lists").click()
            wait_for(pb, lambda d: d.find_element(By.ID, "lists").is_displayed(), "‹ Lists goes to the lists")
            open_list(pb, "Market")

        def checked_items_collapse_and_clear():
            for text in ["Basil", "Onions"]:
                bt.act(lambda: checkbox(pb, text).click())
            wait_for(pb, lambda d: "Checked (" in d.find_element(By.ID, "checked-header").text, "the checked items' header")
            header = pb.find_element(By.ID, "checked-header")
            rows = pb.find_elements(By.CSS_SELECTOR, "#items > *")
            check(rows.index(header) < rows.index(bt.item_row(pb, "Basil")), "checked items come after the header")
            pb.find_element(By.ID, "toggle-checked").click()
            wait_for(pb, lambda d: not shown(d, "Basil") and d.find_element(By.ID, "toggle-checked").text.startswith("Show"),
                     "Hide collapses them")
            pb.refresh()
            bt.wait_ready(pb, "paula")
            wait_for(pb, lambda d: d.find_elements(By.ID, "toggle-checked") and not shown(d, "Basil"), "still collapsed after a reload")
            count = len([i for i in bt.items_on_page(pb) if i[1]])
            pb.find_element(By.ID, "clear-checked").click()
            wait_for(pb, lambda d: not [i for i in bt.items_on_page(d) if i[1]] and not d.find_elements(By.ID, "checked-header"),
                     "Clear checked removes them")
            wait_for(pb, lambda d: pending(d) == 0, "sent")
            check(not [i for i in bt.items_in_cli(oscar, "Market") if i[1]], "gone for oscar too")
            pb.find_element(By.ID, "undo-button").click()
            wait_for(pb, lambda d: len([i for i in bt.items_on_page(d) if i[1]]) == count and pending(d) == 0, "Undo brings them back")
            check(len([i for i in bt.items_in_cli(oscar, "Market") if i[1]]) == count, "back for oscar too")
            pb.find_element(By.ID, "toggle-checked").click()

        def undo_remove_and_untag():
            bt.act(lambda: tool(pb, "Tomatoes", "remove").click())
            wait_for(pb, lambda d: "Tomatoes" not in [i[0] for i in bt.items_on_page(d)], "removed")
            check("Removed “Tomatoes”" in pb.find_element(By.ID, "undo-text").text, pb.find_element(By.ID, "undo-text").text)
            pb.find_element(By.ID, "undo-button").click()
            wait_for(pb, lambda d: "Tomatoes" in [i[0] for i in bt.items_on_page(d)] and pending(d) == 0, "Undo brings it back")
            check("Tomatoes" in [i[0] for i in bt.items_in_cli(oscar, "Market")], "oscar has it")
            milk = item_id(pb, "Milk")
            tags = bt.item_row(pb, "Milk").find_elements(By.CSS_SELECTOR, ".tag-remove")
            check(len(tags) == 2, "Milk has two tags")
            label = tags[0].get_attribute("aria-label")
            check(label == "Remove tag cold from Milk", label)
            tags[0].click()
            wait_for(pb, lambda d: ["Milk", True, ["organic"]] in bt.items_on_page(d), "un-tagged")
            check(pb.find_element(By.ID, "undo-button").get_attribute("aria-label") == "Undo removing tag cold from Milk", "named")
            pb.find_element(By.ID, "undo-button").click()
            wait_for(pb, lambda d: ["Milk", True, ["cold", "organic"]] in bt.items_on_page(d) and pending(d) == 0, "the tag is back")
            check(["Milk", True, ["cold", "organic"]] in bt.items_in_cli(oscar, "Market"), "for oscar too")
            check(milk == item_id(pb, "Milk"), "the same item")

        def who_changed_it_and_when():
            oscar.run("list", "edit", "Market", "Onions", "--add-tag", "red")
            wait_for(pb, lambda d: "oscar · just now" in item_meta(d, "Onions"), "oscar's change, named with the time")
            check(item_meta(pb, "Basil").startswith("you ·"), f"paula's own: {item_meta(pb, 'Basil')!r}")

        def changes_are_announced_per_item():
            live = pb.execute_script("""return [...document.querySelectorAll('[aria-live], [role=status], [role=alert], [role=log]')]
                                        .map((e) => e.id)""")
            check("items" not in live and "list" not in live and "main" not in live, f"the list is no live region: {live}")
            oscar.run("list", "uncheck", "Market", "Onions")
            wait_for(pb, lambda d: d.find_element(By.ID, "announce").get_attribute("textContent") == "oscar unchecked Onions.",
                     "one short message for the change")
            bt.act(lambda: checkbox(pb, "Onions").click())
            wait_for(pb, lambda d: d.find_element(By.ID, "announce").get_attribute("textContent") == "Checked Onions.", "own changes too")

        # MARK: Photos

        def photos_attach_show_and_survive():
            picture = png(24, 16, (200, 60, 20))
            path = os.path.join(directory, "photo.png")
            with open(path, "wb") as out:
                out.write(picture)
            ident = item_id(pb, "Tomatoes")
            # A made-up download URL is refused, as JSON.
            status, _, _ = bt.headers(state["server"].url + "/assets/download/not-a-token/x")
            check(status == 403, f"a made-up download URL is refused: {status}")
            button = bt.act(lambda: tool(pb, "Tomatoes", "photo"))
            check(button.get_attribute("aria-label") == "Add a photo to Tomatoes", button.get_attribute("aria-label"))
            field = pb.find_element(By.ID, f"photo-input-{ident}")
            check(field.get_attribute("type") == "file" and field.get_attribute("accept") == "image/*"
                  and field.get_attribute("capture") == "environment", "a file input that opens the camera on a phone")
            # The server out of reach (its API blocked): the attempt says so, on the row and in the notice.
            pb.execute_cdp_cmd("Network.enable", {})
            pb.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/database/*"]})
            try:
                pb.find_element(By.ID, f"photo-input-{ident}").send_keys(path)
                wait_for(pb, lambda d: "needs a connection" in d.find_element(By.ID, "notice").text
                         and "needs a connection" in d.find_element(By.ID, f"photo-status-{ident}").text,
                         "a photo that cannot be sent says so")
            finally:
                pb.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
            wait_for(pb, lambda d: body_data(d, "online") == "true" and pending(d) == 0, "online again", timeout=20)
            check(photo_loaded(pb, ident)[1] is None, "no thumbnail for a photo not sent")
            # Attached for real: uploaded, saved into the item's photo field, shown as a thumbnail that loads.
            pb.find_element(By.ID, f"photo-input-{ident}").send_keys(path)
            wait_for(pb, lambda d: photo_loaded(d, ident)[0] == 24 and pending(d) == 0, "the thumbnail shows and its image loads")
            width, src, alt = photo_loaded(pb, ident)
            check(alt == "Photo of Tomatoes", f"the alt text names the item: {alt!r}")
            check(not pb.find_elements(By.ID, f"photo-status-{ident}"), "no status left on the row")
            image = pb.find_element(By.ID, f"photo-image-{ident}")
            check(image.get_attribute("loading") == "lazy" and image.rect["width"] <= 64, f"small and lazy: {image.rect}")
            link = pb.find_element(By.ID, f"photo-link-{ident}")
            check(link.get_attribute("href") == state["server"].url + src and src.startswith("/assets/download/"),
                  f"the thumbnail opens the whole image: {link.get_attribute('href')}")
            with urllib.request.urlopen(state["server"].url + src, timeout=10) as response:
                check(response.read() == picture and response.headers["Content-Type"] == "image/png",
                      "the download URL serves the bytes sent, as image/png")
            check(button_label(pb, ident) == "Change the photo of Tomatoes", "the button now changes the photo")
            check("Tomatoes" in [i[0] for i in bt.items_in_cli(oscar, "Market")], "the CLI syncs the item with its photo")
            # A reload shows it from what the browser kept.
            pb.refresh()
            bt.wait_ready(pb, "paula")
            wait_for(pb, lambda d: photo_loaded(d, ident)[0] == 24, "the photo after a reload")
            # Another person in another browser, with a download URL of his own.
            ob = bt.browser()
            drivers.append(ob)
            try:
                ob.get(oscar.run("login", "--web"))
                bt.wait_ready(ob, "oscar")
                open_list(ob, "Market")
                wait_for(ob, lambda d: photo_loaded(d, ident)[0] == 24, "oscar's browser shows the photo")
                check(photo_loaded(ob, ident)[1] != photo_loaded(pb, ident)[1], "each reader has a URL of his own")
            finally:
                ob.quit()
                drivers.remove(ob)
            # A URL that stops working (expired, say) is asked for again once, and the image loads.
            time.sleep(1.1)  # a fresh URL differs from the last only when its expiry (in seconds) does
            pb.execute_script("""const img = document.getElementById('photo-image-' + arguments[0]);
                                 img.src = img.getAttribute('src').replace('/assets/download/', '/assets/download/x');""", ident)
            wait_for(pb, lambda d: photo_loaded(d, ident)[0] == 24 and "/download/x" not in photo_loaded(d, ident)[1],
                     "a failed thumbnail loads again with a fresh URL")
            # Undo of a removal that was sent brings the item back with its photo.
            bt.act(lambda: tool(pb, "Tomatoes", "remove").click())
            wait_for(pb, lambda d: "Tomatoes" not in [i[0] for i in bt.items_on_page(d)] and pending(d) == 0, "removed and sent")
            pb.find_element(By.ID, "undo-button").click()
            wait_for(pb, lambda d: photo_loaded(d, ident)[0] == 24 and pending(d) == 0, "Undo brings the item back with its photo")

        def controls_have_unique_names():
            oscar.run("list", "add", "Market", "Milk")  # a second Milk
            wait_for(pb, lambda d: [i[0] for i in bt.items_on_page(d)].count("Milk") == 2, "two Milks")
            for size in (False, True):
                bt.phone(pb, size)
                pb.find_element(By.ID, "share-button").click()
                wait_for(pb, lambda d: d.find_elements(By.ID, "participants") and d.find_elements(By.CSS_SELECTOR, "#participants li"),
                         "the people")
                names = pb.execute_script(NAMES_JS)
                seen = {}
                for ident, name in names:
                    seen.setdefault(name, []).append(ident)
                duplicates = {name: ids for name, ids in seen.items() if len(ids) > 1}
                check(not duplicates, f"controls sharing a name ({'phone' if size else 'desktop'}): {duplicates}")
                check(any(name == "Milk (2)" for _, name in names), "the second Milk is told apart")
                pb.back()
                wait_for(pb, lambda d: not d.find_elements(By.ID, "share-panel"), "closed")
            print(f"  {len(names)} controls, each named once")

        def skip_link_title_and_heading():
            bt.phone(pb, False)
            pb.get(state["server"].url + "/")
            bt.wait_ready(pb, "paula")
            check(pb.title == "Lists · Lattice", pb.title)
            check([h.text for h in pb.find_elements(By.TAG_NAME, "h1")] == ["Lists"], "one h1: Lists")
            open_list(pb, "Market")
            check(pb.title == "Market · Lattice", pb.title)
            check([h.text for h in pb.find_elements(By.TAG_NAME, "h1")] == ["Market"], "one h1: the list's title")
            pb.get(pb.current_url.split("#")[0] + "#list=" + pb.find_element(By.CSS_SELECTOR, ".list-link.current").get_attribute("data-list"))
            pb.refresh()
            bt.wait_ready(pb, "paula")
            wait_for(pb, lambda d: d.find_elements(By.ID, "new-item"), "the list")
            bt.press(pb, Keys.TAB)
            wait_for(pb, lambda d: bt.focused(d) and bt.focused(d)["id"] == "skip-link", "the first Tab reaches the skip link")
            bt.check_focus_visible(bt.focused(pb))
            check(pb.find_element(By.ID, "skip-link").is_displayed(), "the skip link shows when focused")
            bt.press(pb, Keys.ENTER)
            wait_for(pb, lambda d: bt.focused(d) and bt.focused(d)["id"] == "new-item", "Enter skips to the list's quick-add field")
            for selector in ["#list-title", "#items label.text", "#items .tag > span", "#lists .title"]:
                check(all(e.get_attribute("dir") == "auto" for e in pb.find_elements(By.CSS_SELECTOR, selector)), f"dir=auto on {selector}")

        # MARK: Sharing

        def share_link_short_and_turned_off():
            open_list(pb, "Errands")
            pb.find_element(By.ID, "share-button").click()
            wait_for(pb, lambda d: d.find_element(By.ID, "make-link"), "the share panel").click()
            link = wait_for(pb, lambda d: d.find_element(By.ID, "link-url").get_attribute("value"), "the link")
            check(link.startswith(state["server"].url + "/s/") and len(link) < 60, f"a short link: {link}")
            status, _, body = bt.headers(link)
            check(status == 200 and "Errands" in body, f"it opens the share page: {status}")
            quinn = bt.CLI(os.path.join(directory, "quinn"))
            quinn.run("signup", "quinn", "--server", state["server"].url)
            quinn.run("accept", link, "--yes")
            state["quinn"] = quinn
            wait_for(pb, lambda d: d.find_elements(By.CSS_SELECTOR, "#participants li[data-participant='quinn']"),
                     "quinn shows in the people as he joins")
            bt.shoot_both(pb, "client-share")
            bt.phone(pb, False)
            pb.find_element(By.ID, "revoke-links").click()
            pb.find_element(By.ID, "revoke-links").click()
            wait_for(pb, lambda d: "no longer work" in d.find_element(By.ID, "notice").text, "the links are turned off")
            status, _, _ = bt.headers(link)
            check(status == 404, f"the old link no longer works: {status}")
            check(pb.find_element(By.ID, "link-url").get_attribute("value") == "", "no link shown")

        def invite_only_with_consent():
            rita = bt.CLI(os.path.join(directory, "rita"))
            rita.run("signup", "rita", "--server", state["server"].url)
            state["rita"] = rita
            bt.type_into(pb, "invite-name", "rita")
            pb.find_element(By.ID, "invite-button").click()
            consent = wait_for(pb, lambda d: d.find_element(By.ID, "consent") if d.find_element(By.ID, "consent").is_displayed() else None,
                               "the page asks before making the list invite-only")
            check("1 person who joined by link" in consent.text and "rita" in consent.text, consent.text)
            check(not [p for p in paula.json("share", "participants", "Errands")["participants"] if p["name"] == "rita"],
                  "nothing changed while asked")
            pb.find_element(By.ID, "consent-yes").click()
            wait_for(pb, lambda d: d.find_elements(By.CSS_SELECTOR, "#participants li[data-participant='rita']"), "rita is invited")
            check(pb.find_element(By.ID, "invite-name").get_attribute("value") == "", "the invite field is cleared")
            check(pb.find_element(By.ID, "share-mode").get_attribute("value") == "invite", "the list is invite-only now")
            roster = {p["name"]: p["status"] for p in paula.json("share", "participants", "Errands")["participants"]}
            check(roster.get("rita") == "pending" and roster.get("quinn") == "removed", f"the roster: {roster}")

        def invitations_and_members():
            rb = bt.browser()
            drivers.append(rb)
            rb.get(state["rita"].run("login", "--web"))
            bt.wait_ready(rb, "rita")
            wait_for(rb, lambda d: d.find_elements(By.CSS_SELECTOR, "#invitation-list li"), "rita's invitation")
            check("Errands" in rb.find_element(By.ID, "invitation-list").text and "paula" in rb.find_element(By.ID, "invitation-list").text,
                  rb.find_element(By.ID, "invitation-list").text)
            bt.shoot_both(rb, "client-invitations")
            bt.phone(rb, False)
            rb.find_element(By.CSS_SELECTOR, "#invitation-list button").click()
            open_list(rb, "Errands")
            rb.find_element(By.ID, "share-button").click()
            wait_for(rb, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#participants li")) >= 2, "the members")
            members = rb.find_element(By.ID, "participants").text
            check("paula" in members and "owner" in members and "rita (you)" in members and "can view" in members, members)
            check(not rb.find_elements(By.ID, "invite-form"), "a member does not get the owner's controls")
            state["rb"] = rb

        def stop_sharing():
            pb.find_element(By.ID, "stop-sharing").click()
            pb.find_element(By.ID, "stop-sharing").click()
            wait_for(pb, lambda d: "no longer shared" in d.find_element(By.ID, "notice").text, "stopped")
            rb = state["rb"]
            wait_for(rb, lambda d: "Errands" not in [t.text for t in d.find_elements(By.CSS_SELECTOR, "#lists .list-link .title")]
                     and "no longer available" in d.find_element(By.ID, "notice").text, "rita loses the list, with a notice")
            rb.quit()
            drivers.remove(rb)

        def leave_says_left():
            pb.get(state["server"].url + "/")
            bt.wait_ready(pb, "paula")
            open_list(pb, "Market")
            pb.find_element(By.ID, "leave").click()
            pb.find_element(By.ID, "leave").click()
            wait_for(pb, lambda d: "Left “Market”." in d.find_element(By.ID, "notice").text, "the page says Left")

        def screenshots_of_lists_and_list():
            bt.phone(pb, False)
            paula.run("list", "create", "Garden")
            for text in ["Seeds", "Gloves", "Compost", "Watering can"]:
                paula.run("list", "add", "Garden", text)
            paula.run("list", "edit", "Garden", "Seeds", "--add-tag", "spring")
            paula.run("list", "check", "Garden", "Gloves")
            pb.get(state["server"].url + "/")
            bt.wait_ready(pb, "paula")
            wait_for(pb, lambda d: "Garden" in [t.text for t in d.find_elements(By.CSS_SELECTOR, "#lists .list-link .title")], "Garden")
            bt.phone(pb, True)
            bt.shoot_both(pb, "client-lists")
            open_list(pb, "Garden")
            wait_for(pb, lambda d: len(bt.items_on_page(d)) == 4, "Garden's items")
            bt.shoot_both(pb, "client-list")

        def sign_out_leaves_nothing_behind():
            kept = pb.execute_async_script("""
                const done = arguments[arguments.length - 1];
                indexedDB.databases().then((all) => done(all.map((d) => d.name)));""")
            check(any(name.startswith("lattice-_") for name in kept), f"the account's database while signed in: {kept}")
            pb.find_element(By.ID, "signout").click()
            wait_for(pb, lambda d: d.find_elements(By.ID, "signup-form"), "signed out: the sign-in page")
            left = pb.execute_async_script("""
                const done = arguments[arguments.length - 1];
                indexedDB.databases().then((all) => done([all.map((d) => d.name), Object.keys(localStorage)]));""")
            check(not [n for n in left[0] if n.startswith("lattice-")], f"databases left: {left[0]}")
            check(not [k for k in left[1] if k in ("lattice.lastSession", "lattice.drafts")], f"storage left: {left[1]}")

        def no_script_error_or_csp_violation():
            # Refused connections while offline are logged by the browser, and expected; nothing else is.
            for driver in drivers:
                problems = [m for m in bt.console_problems(driver)
                            if "Content Security Policy" in m or "Uncaught" in m or "Refused" in m]
                check(not problems, f"script errors or CSP violations: {problems[:3]}")

        results = bt.run_suite("web client", [
            ("installable: a manifest and a service worker control the page", installable),
            ("the page's join of CRDT states agrees with the server's (seeded random edits)", the_page_joins_as_the_server_does),
            ("offline on a phone: the page says so, adds, checks and edits show at once and wait",
             offline_is_said_and_edits_show_at_once),
            ("offline reload: it opens from the service worker with the lists, waiting edits and a draft",
             reload_opens_from_the_service_worker),
            ("back online: the waiting edits are sent and reach the CLI", back_online_the_edits_reach_the_cli),
            ("edits the CLI made offline merge with them (a later edit wins whatever the arrival order)", offline_cli_edits_merge),
            ("an offline edit to an item removed meanwhile is kept and can be brought back", an_edit_to_an_item_removed_meanwhile_is_kept),
            ("a change made with the CLI arrives on the page's push stream, without a reload", a_cli_change_arrives_on_the_push_stream),
            ("a stale edit field says so and asks before saving over the other change", stale_edit_field_asks_before_saving),
            ("an untouched edit field follows the other change; Use their text", untouched_field_follows_and_use_their_text),
            ("an item removed while edited keeps the text and Restore brings it back", removed_while_edited_keeps_the_text),
            ("the caret stays put on live updates", caret_stays_put_on_live_updates),
            ("phone: quick-add on top, one row per item", quick_add_is_on_top),
            ("phone: Back moves inside the app (lists, list, share panel)", back_stays_in_the_app),
            ("checked items collapse (remembered) and can be cleared, with undo", checked_items_collapse_and_clear),
            ("Remove and un-tag offer undo", undo_remove_and_untag),
            ("who changed an item and when", who_changed_it_and_when),
            ("changes are announced per item; the list is no live region", changes_are_announced_per_item),
            ("photos: attached from a file input, shown as thumbnails, kept after a reload and for others", photos_attach_show_and_survive),
            ("every control has a unique accessible name", controls_have_unique_names),
            ("the skip link, the title and the h1; dir=auto on user text", skip_link_title_and_heading),
            ("sharing: a short link, turned off", share_link_short_and_turned_off),
            ("invite by name: invite-only with consent, the field clears", invite_only_with_consent),
            ("a pending invitation on the lists page; a member sees the people", invitations_and_members),
            ("stop sharing: the member loses the list", stop_sharing),
            ("leaving says Left", leave_says_left),
            ("screenshots of the lists and a list", screenshots_of_lists_and_list),
            ("sign-out leaves nothing of the account in the browser", sign_out_leaves_nothing_behind),
            ("no script error or CSP violation in the whole run", no_script_error_or_csp_violation),
        ])
    finally:
        bt.quit_all(drivers)
        state_server = locals().get("state", {}).get("server", server)
        state_server.stop()
        if os.environ.get("KEEP"):
            print(f"kept {directory}")
        else:
            shutil.rmtree(directory, ignore_errors=True)
    print(f"{sum(results)} of {len(results)} web client tests passed")
    return 0 if results and all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
