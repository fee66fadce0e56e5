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
- notes and order (issue 34): two browsers and a CLI edit different paragraphs of an item's note (a TEXT),
  offline, and every edit stays; the caret moves with what arrives before it, and nothing typed meanwhile is
  lost; items are reordered by dragging (mouse and touch), Alt+Arrow keys and Move buttons, kept after a
  reload and the same for others, and renumbered when no position fits between two neighbours; the page's
  join of lists and texts is the servers' (two servers, seeded concurrent histories);
- sharing: a short link made and turned off, invite-only with consent, the invite field clears, members
  and their access, stop sharing, pending invitations;
- screenshots of each page at 1280 x 800 and 390 x 844 (Docs/images/client-*.png), each checked for names,
  contrast and sideways scrolling first.

Run through Scripts/browser-tests.sh (the environment of browser_tests.py, whose helpers it uses); run alone,
`-k TEXT` (repeatable) runs only the tests whose name contains TEXT: the join tests, the note and the
reorder tests stand alone, the others build on the ones before them.
"""
import argparse
import json
import os
import random
import shutil
import socket
import struct
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zlib

from selenium.webdriver.common.action_chains import ActionChains
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


class Account:
    """An account on a server, driven through the HTTP API with its bearer token (no page, no CLI): for states
    the server itself makes. Its records live in its private zone `Lists`."""

    def __init__(self, url, name):
        self.url = url
        self.token = self.post("/auth/signup", {"name": name}, auth=False)["token"]
        self.call("zones/modify", {"operations": [{"operationType": "create", "zone": {"zoneID": {"zoneName": "Lists"}}}]})

    def post(self, path, body, auth=True):
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token}"
        for attempt in range(30):  # THROTTLED and TRY_AGAIN_LATER say when to come back
            request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as error:
                answer = error.read().decode()
                if error.code in (429, 503) and attempt < 29:
                    time.sleep(float(error.headers.get("Retry-After") or 1))
                    continue
                raise bt.Failure(f"{path}: {error.code} {answer[:400]}")
        raise bt.Failure(f"{path}: still refused")

    def call(self, operation, body):
        return self.post(f"/database/1/lattice/development/private/{operation}", body)

    def modify(self, record, operation="forceUpdate"):
        answer = self.call("records/modify", {"zoneID": {"zoneName": "Lists"}, "operations": [{"operationType": operation, "record": record}]})
        record = answer["records"][0]
        check("serverErrorCode" not in record, f"records/modify refused: {record}")
        return record

    def lookup(self, name):
        record = self.call("records/lookup", {"zoneID": {"zoneName": "Lists"}, "records": [{"recordName": name}]})["records"][0]
        check("serverErrorCode" not in record, f"records/lookup: {record}")
        return record

    def take(self, state):
        """Joins a record state (another server's, or a page's) into this account's copy: forceUpdate with its
        `crdt` keys, without what only a server adds."""
        state = {k: v for k, v in state.items() if k not in ("zoneID", "created", "modified", "recordChangeTag")}
        return self.modify(state)


def stamp_text(stamp):
    return f"{stamp['ms']}.{stamp['counter']}@{stamp['replica']}"


def field_shape(field):
    """A field's JSON form, comparable however its keys are ordered: type, value, runs (a list or text's), set
    entries, a register's stamp, the context, a list's per-element types."""
    if field is None:
        return None
    crdt = field.get("crdt", {})
    return (field.get("type"), json.dumps(field.get("value"), ensure_ascii=False), json.dumps(crdt.get("runs")),
            sorted(f"{json.dumps(e['value'])}:{stamp_text(e['stamp'])}" for e in crdt.get("entries", [])),
            stamp_text(crdt["stamp"]) if "stamp" in crdt else None, sorted(stamp_text(s) for s in crdt.get("context", [])),
            json.dumps(crdt.get("types")))


def random_splices(rng, length, pieces, inserted):
    """1 to 3 splices [position, deleteCount, inserted] that fit a value of `length` elements, each counted in
    the value the ones before it left (as records/modify reads them)."""
    splices = []
    for _ in range(rng.randint(1, 3)):
        at = rng.randint(0, length)
        cut = rng.randint(0, min(3, length - at))
        piece = inserted(rng.choice(pieces))
        splices.append([at, cut, piece])
        length += len(piece) - cut
    return splices


# The page's join of two servers' states of records (SEQUENCE_JS): its joins in both orders, and a note and a tags
# edit made here on the servers' join, with what the page shows once it joins them.
SEQUENCE_JS = r"""
const [cases, done] = arguments;
(async () => {
  const crdt = await import('/web/crdt.js');
  const out = [];
  for (const { a, b, joined } of cases) {
    const clock = new crdt.Clock(crdt.newReplicaID());
    clock.observeRecord(joined);
    const note = [...joined.fields.note.value];
    note.splice(Math.floor(note.length / 2), Math.min(2, note.length), 'Ω', '😀', '\n');
    const noteEdit = crdt.editText(joined, clock, 'note', note.join(''));
    const tagsEdit = crdt.editSet(joined, clock, 'tags', ['z', 'a'], ['b']);
    out.push({ ab: crdt.joinRecords(a, b), ba: crdt.joinRecords(b, a), edits: [noteEdit, tagsEdit],
               edited: crdt.joinRecords(crdt.joinRecords(joined, noteEdit), tagsEdit) });
  }
  done(out);
})().catch((error) => done({ error: String(error && error.stack || error) }));
"""


# A records/ operation (arguments: its name and body) in the signed-in person's private database, from the page.
PRIVATE_CALL_JS = r"""
const [operation, body, done] = arguments;
(async () => {
  const session = await (await fetch('/auth/session')).json();
  const reply = await fetch(`/database/1/${session.container}/${session.environment}/private/${operation}`, {
    method: 'POST', headers: { 'X-Lattice-CSRF': session.csrfToken, 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  done(await reply.json());
})().catch((error) => done({ error: String(error) }));
"""


def note_text(driver):
    return driver.execute_script("const f = document.getElementById('note-input'); return f ? f.value : null;")


def open_note(driver, text):
    bt.act(lambda: tool(driver, text, "note").click())
    return wait_for(driver, lambda d: d.find_element(By.ID, "note-input"), f"the note of {text!r} opens")


def caret_to(driver, offset):
    """Puts the caret of the open note at `offset` (UTF-16, as the text box counts) and focuses it."""
    driver.execute_script("const f = document.getElementById('note-input'); f.focus(); f.setSelectionRange(arguments[0], arguments[0]);",
                          offset)


def open_order(driver):
    """The texts of the unchecked items, as shown."""
    return [i[0] for i in bt.items_on_page(driver) if not i[1]]


def set_offline(driver, offline):
    """Cuts a browser off the server's API (its requests fail, as with no network) or lets it through again."""
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/database/*", "*/auth/session"] if offline else []})


# The accessible name of every control a person can reach, as browser_tests' accessibility check reads it.
NAMES_JS = r"""
const visible = (e) => e.getClientRects().length && getComputedStyle(e).visibility !== 'hidden' && !e.closest('[hidden]');
""" + bt.NAME_OF_JS + r"""
return [...document.querySelectorAll('button, input, select, textarea, a[href]')].filter(visible)
  .map((e) => [e.id, nameOf(e)]);
"""


# Seeded random edits by three replicas of the page's CRDT (Web/crdt.js) to one record (its text, check, tags
# as a set, a note as a text typed into at random places, a removal), joined by the page in one order and in
# the reverse, and sent to the server (records/modify, forceUpdate of each state) in that shuffled order: the
# three must agree on the record, values, stamps and the note's runs alike.
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
    const tags = f.tags ? [f.tags.type, [...f.tags.value].sort(), f.tags.crdt.entries.map((e) => `${e.value}:${stamp(e.stamp)}`).sort(),
                           f.tags.crdt.context.map(stamp).sort()] : null;
    const note = f.note ? [f.note.type, f.note.value, JSON.stringify(f.note.crdt.runs), f.note.crdt.context.map(stamp).sort()] : null;
    return { deleted: false, generation: r.crdt.generation, text: reg('text'), done: reg('done'), tags, note };
  };
  const zoneID = { zoneName: 'Lists' };
  const failures = [];
  let sent = 0;
  for (let round = 0; round < rounds; round += 1) {
    const name = `join-${seed}-${round}`;
    const made = await post('records/modify', { zoneID, operations: [{ operationType: 'create', record: { recordName: name, recordType: 'Item',
      fields: { text: { value: 'base' }, done: { value: 0 }, tags: { value: ['a', 'b'], type: 'STRING_SET' },
                note: { value: 'one\ntwo 😀\nthree', type: 'TEXT' } } } }] });
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
      if (kind < 0.2) state = crdt.setFields(r.view, r.clock, { text: [pick(['x', 'y', 'z']), 'STRING'] });
      else if (kind < 0.3) state = crdt.setFields(r.view, r.clock, { done: [pick([0, 1]), 'INT64'] });
      else if (kind < 0.6) { // the note typed into: a splice at a random place of the text this replica sees
        const note = [...((r.view.fields.note && r.view.fields.note.value) || '')];
        const at = Math.floor(rand() * (note.length + 1));
        const cut = Math.min(note.length - at, Math.floor(rand() * 3));
        note.splice(at, cut, ...pick(['', 'a', 'bc', 'é', '😀', '\n', 'word ']));
        state = crdt.editText(r.view, r.clock, 'note', note.join(''));
        if (!state) continue;
      } else if (kind < 0.92) {
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
    parser = argparse.ArgumentParser(description="Lattice web client browser tests")
    parser.add_argument("-k", action="append", default=[], metavar="TEXT",
                        help="run only the tests whose name contains TEXT (repeatable); most build on the ones before")
    chosen = [text.lower() for text in parser.parse_args().k]
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

        def the_page_joins_lists_and_texts_as_servers_do():
            # Two servers, so two node replica ids: each makes states of the same records from a common start
            # (plain records/modify splices of a note and a tags list; a field written as different kinds on
            # each), sometimes hearing of the other's part way. The page joins the two final states in both
            # orders; the first server joins the second's: fields, runs and contexts must be the same.
            seed = int(os.environ.get("SEED", str(int(time.time()) % 100000)))
            print(f"  seed {seed} (SEED={seed} repeats it)")
            rng = random.Random(seed)
            second_directory = os.path.join(directory, "second")
            os.makedirs(second_directory, exist_ok=True)
            second = bt.Server(second_directory)
            try:
                one = Account(state["server"].url, "sequences")
                two = Account(second.url, "sequences")
                letters = ["a", "bc", "é", "😀", "\n", "word ", "Ω", ""]
                cases = []
                for history in range(8):
                    name = f"seq-{seed}-{history}"
                    base = "".join(rng.choice(letters) for _ in range(rng.randint(0, 12)))
                    one.modify({"recordName": name, "recordType": "Item", "fields": {
                        "note": {"value": base, "type": "TEXT"}, "tags": {"value": ["a", "b", "a"], "type": "STRING_LIST"}}}, "create")
                    start = one.lookup(name)
                    two.take(start)
                    # One field each side writes as another kind: a set here, a text there (text wins); a
                    # register here, a text there. And one list each side makes with elements of another type:
                    # the join holds both, its type the first element's, with each element's type said.
                    one.modify({"recordName": name, "fields": {"mood": {"add": ["calm"], "type": "STRING_SET"},
                                                               "label": {"value": "plain", "type": "STRING"},
                                                               "nums": {"value": [1, 2], "type": "INT64_LIST"}}})
                    two.modify({"recordName": name, "fields": {"mood": {"splices": [[0, 0, "busy"]], "type": "TEXT"},
                                                               "label": {"value": "rich", "type": "TEXT"},
                                                               "nums": {"value": ["x", "y"], "type": "STRING_LIST"}}})
                    for _ in range(rng.randint(4, 14)):
                        side, other = rng.sample([one, two], 2)
                        kind = rng.random()
                        if kind < 0.55:
                            now = side.lookup(name)["fields"]["note"]["value"]
                            side.modify({"recordName": name, "fields": {"note": {"type": "TEXT", "splices": random_splices(
                                rng, len([c for c in now]), letters, lambda piece: piece)}}})
                        elif kind < 0.8:
                            now = side.lookup(name)["fields"]["tags"]["value"]
                            side.modify({"recordName": name, "fields": {"tags": {"type": "STRING_LIST", "splices": random_splices(
                                rng, len(now), ["x", "y", "a"], lambda piece: [piece] * rng.randint(0, 2))}}})
                        else:
                            other.take(side.lookup(name))  # hears of the other's edits so far
                    a, b = one.lookup(name), two.lookup(name)
                    one.take(b)
                    two.take(a)
                    joined, joined_there = one.lookup(name), two.lookup(name)
                    for field in ("note", "tags", "mood", "label", "nums"):
                        check(field_shape(joined["fields"].get(field)) == field_shape(joined_there["fields"].get(field)),
                              f"{name}: the two servers' joins of {field} differ")
                    check(joined["fields"]["mood"]["type"] == "TEXT" and joined["fields"]["label"]["type"] == "TEXT",
                          f"{name}: the greater kind wins: {joined['fields']['mood']} {joined['fields']['label']}")
                    cases.append({"name": name, "a": a, "b": b, "joined": joined})
                found = pb.execute_async_script(SEQUENCE_JS, cases)
                check(isinstance(found, list), f"the page's script: {found}")
                mismatches = []
                for case, page in zip(cases, found):
                    for field in ("note", "tags", "mood", "label", "nums"):
                        want = field_shape(case["joined"]["fields"].get(field))
                        for order in ("ab", "ba"):
                            got = field_shape(page[order]["fields"].get(field))
                            if got != want:
                                mismatches.append(f"{case['name']} {field} ({order}): page {got} / server {want}")
                    # The page's own edits of the joined state, sent to the server, read back as the page shows them.
                    for edit in page["edits"]:
                        one.take(edit)
                    server = one.lookup(case["name"])
                    for field in ("note", "tags"):
                        if field_shape(server["fields"].get(field)) != field_shape(page["edited"]["fields"].get(field)):
                            mismatches.append(f"{case['name']} {field} after the page's edit: page "
                                              f"{field_shape(page['edited']['fields'].get(field))} / server {field_shape(server['fields'].get(field))}")
                check(not mismatches, f"{len(mismatches)} differences: {mismatches[:3]}")
                print(f"  8 histories: the page's joins in both orders, and its edits, are the servers'")
                example = cases[0]["joined"]["fields"]
                print(f"  e.g. {example['note']['value']!r}, tags {example['tags']['value']}, nums {example['nums']['value']} "
                      f"({example['nums']['type']}, types {example['nums']['crdt'].get('types')})")
            finally:
                second.stop()

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
            # One line per item; a row whose tools are open (its ⋯ pressed) has them on lines of their own below it.
            rows = pb.find_elements(By.CSS_SELECTOR, "#items li.item:not(.open) .item-row")
            heights = [r.rect["height"] for r in rows if r.is_displayed()]
            check(heights and max(heights) < 90, f"one row per item: heights {heights}")
            for tools in pb.find_elements(By.CSS_SELECTOR, "#items li.item.open .item-tools"):
                box = tools.rect
                check(box["x"] >= 0 and box["x"] + box["width"] <= 390 and box["height"] < 100, f"open tools fit the screen: {box}")

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

        # MARK: Notes and order

        def private_call(operation, body):
            """A records/ operation in paula's private database, asked from her page with its session."""
            reply = pb.execute_async_script(PRIVATE_CALL_JS, operation, body)
            check("records" in reply and not any(r.get("serverErrorCode") for r in reply["records"]), f"{operation}: {reply}")
            return reply["records"]

        def private_write(record_name, fields):
            """Writes plain fields of a record of paula's own lists, as the server stamps them; her page then syncs (its
            own session wrote them, so no push tells it: it is told the network is back)."""
            private_call("records/modify", {"zoneID": {"zoneName": "Lists"}, "operations": [
                {"operationType": "forceUpdate", "record": {"recordName": record_name, "recordType": "Item", "fields": fields}}]})
            pb.execute_script("window.dispatchEvent(new Event('online'))")

        def oscar_browser():
            """oscar's own browser with Market open (made once, for the note and reorder tests)."""
            if "ob" not in state:
                ob = bt.browser()
                drivers.append(ob)
                state["ob"] = ob
                ob.get(oscar.run("login", "--web"))
                bt.wait_ready(ob, "oscar")
                open_list(ob, "Market")
            return state["ob"]

        def notes_merge_paragraph_edits_one_offline():
            # paula (this browser), oscar (a browser of his own) and paula's CLI edit different paragraphs of one
            # item's note; oscar's page is cut off meanwhile and the CLI does not sync. paula keeps typing while
            # their edits arrive: her caret moves by what they inserted before it, and nothing she types is lost.
            bt.phone(pb, False)
            oscar.run("list", "add", "Market", "Trip")
            wait_for(pb, lambda d: "Trip" in open_order(d), "Trip shows")
            field = open_note(pb, "Trip")
            check(field.tag_name == "textarea" and field.get_attribute("value") == "", "an empty note opens as a text box")
            check(pb.execute_script("return document.activeElement.id") == "note-input", "the focus goes to the note")
            base = "Pack:\nsunscreen\n\nTickets:\nprint them\n\nHotel:\ncall ahead"
            field.send_keys(base)
            wait_for(pb, lambda d: note_text(d) == base and pending(d) == 0, "paula's note is saved as she types")
            check(bt.item_row(pb, "Trip").find_element(By.CSS_SELECTOR, ".note-preview").text == "Pack:", "the row shows its first line")
            ob = oscar_browser()
            wait_for(ob, lambda d: "Trip" in open_order(d), "oscar's page shows Trip")
            open_note(ob, "Trip")
            wait_for(ob, lambda d: note_text(d) == base, "oscar's page has the note")
            # paula's CLI edits the middle paragraph without syncing (queued, as offline).
            paula.run("sync")
            paula.run("list", "note", "Market", "Trip", base.replace("print them", "print them twice"), "--no-sync")
            set_offline(ob, True)
            try:
                caret_to(ob, base.index("sunscreen") + len("sunscreen"))
                ob.find_element(By.ID, "note-input").send_keys(" and hats")
                wait_for(ob, lambda d: body_data(d, "online") == "false" and pending(d) >= 1, "oscar's edit waits offline", timeout=15)
                check(note_text(ob) == base.replace("sunscreen", "sunscreen and hats"), f"his edit shows at once: {note_text(ob)!r}")
                # paula types at the end of the last paragraph, online.
                caret_to(pb, len(base))
                pb.find_element(By.ID, "note-input").send_keys(" by Friday")
                wait_for(pb, lambda d: pending(d) == 0, "paula's edit is sent")
            finally:
                set_offline(ob, False)
            ob.execute_script("window.dispatchEvent(new Event('online'))")  # as the browser says when the network is back
            paula.run("sync")  # the CLI's edit goes too
            # paula goes on typing, one key at a time, until his edit has arrived and a few keys after it.
            typed = []
            arrived_after = None
            for ch in " (noon; ask for a quiet room on a high floor, away from the lift, with a view of the sea if they have one)":
                pb.find_element(By.ID, "note-input").send_keys(ch)
                typed.append(ch)
                if arrived_after is None and "and hats" in (note_text(pb) or ""):
                    arrived_after = len(typed)
                if arrived_after is not None and len(typed) >= arrived_after + 4:
                    break
                time.sleep(0.1)
            typed = "".join(typed)
            check(arrived_after is not None and arrived_after <= len(typed) - 4,
                  f"oscar's edit arrived while paula typed (after key {arrived_after} of {len(typed)})")
            expected = base.replace("sunscreen", "sunscreen and hats").replace("print them", "print them twice") + " by Friday" + typed
            wait_for(pb, lambda d: note_text(d) == expected, f"paula's note holds the three edits and all she typed: {note_text(pb)!r}")
            caret = pb.execute_script("const f = document.getElementById('note-input'); return [document.activeElement.id, f.selectionStart, f.selectionEnd];")
            check(caret == ["note-input", len(expected), len(expected)], f"her caret stayed after what she typed: {caret} of {len(expected)}")
            wait_for(ob, lambda d: note_text(d) == expected and pending(d) == 0, f"oscar's page has the same note: {note_text(ob)!r}")
            wait_for(pb, lambda d: pending(d) == 0, "all sent")
            for cli in (oscar, paula):
                cli.run("sync")
                notes = [i.get("note") for i in cli.json("list", "show", "Market")["items"] if i["text"] == "Trip"]
                check(notes == [expected], f"the CLI reads the same note: {notes}")
            pb.refresh()
            bt.wait_ready(pb, "paula")
            open_list(pb, "Market")
            open_note(pb, "Trip")
            check(note_text(pb) == expected, "the note after a reload")
            # A change that arrives before the caret moves it by what was inserted; a selection keeps its characters.
            start, end = expected.index("print"), expected.index("print") + len("print them")
            pb.execute_script("const f = document.getElementById('note-input'); f.focus(); f.setSelectionRange(arguments[0], arguments[1]);", start, end)
            caret_to(ob, 0)
            ob.find_element(By.ID, "note-input").send_keys("Trip notes\n")
            later = "Trip notes\n" + expected
            wait_for(pb, lambda d: note_text(d) == later, "oscar's line arrives")
            selected = pb.execute_script("const f = document.getElementById('note-input'); return f.value.slice(f.selectionStart, f.selectionEnd);")
            check(selected == "print them", f"paula's selection still covers the same words: {selected!r}")
            pb.find_element(By.ID, "note-done").click()
            wait_for(pb, lambda d: not d.find_elements(By.ID, "note-input") and bt.focused(d)["id"] == "note-" + item_id(d, "Trip"),
                     "Done closes the note; the focus goes back to its button")
            # The item removed elsewhere while its note is open: the note closes, and Undo brings both back.
            open_note(pb, "Trip")
            oscar.run("list", "remove", "Market", "Trip")
            wait_for(pb, lambda d: not d.find_elements(By.ID, "note-input")
                     and "oscar removed “Trip” while you were editing its note" in d.find_element(By.ID, "notice").text,
                     "the page says the item went")
            pb.find_element(By.ID, "undo-button").click()
            wait_for(pb, lambda d: "Trip" in open_order(d) and pending(d) == 0, "Undo brings Trip back")
            open_note(pb, "Trip")
            check(note_text(pb) == later, f"with its note: {note_text(pb)!r}")
            pb.find_element(By.ID, "note-done").click()
            print(f"  the note: {later!r}")

        def drag_and_keys_reorder_items():
            # Dragging an unchecked item by its handle (a mouse here, a finger on a phone below), Alt+Arrow keys and
            # the Move buttons: the order is kept after a reload and oscar's page shows the same.
            ob = oscar_browser()
            bt.phone(pb, False)
            pb.refresh()
            bt.wait_ready(pb, "paula")
            open_list(pb, "Market")
            before = open_order(pb)
            check(len(before) >= 4, f"unchecked items to move: {before}")
            last, first = before[-1], before[0]
            handle = pb.find_element(By.ID, "drag-" + item_id(pb, last))
            target = bt.item_row(pb, first)
            ActionChains(pb).click_and_hold(handle).pause(0.2).move_to_element_with_offset(target, 0, -target.size["height"] // 2 - 5) \
                .pause(0.2).release().perform()
            expected = [last] + before[:-1]
            wait_for(pb, lambda d: open_order(d) == expected, f"{last!r} dragged to the top: {open_order(pb)}")
            wait_for(pb, lambda d: pending(d) == 0, "the move is sent")
            pb.refresh()
            bt.wait_ready(pb, "paula")
            open_list(pb, "Market")
            check(open_order(pb) == expected, f"the order after a reload: {open_order(pb)}")
            wait_for(ob, lambda d: open_order(d) == expected, f"oscar's page shows the same order: {open_order(ob)}")
            # The keyboard: Alt+ArrowDown on an item's box moves it one place down; the focus stays on the box.
            second = expected[1]
            box = checkbox(pb, second)
            box.send_keys(Keys.ALT, Keys.ARROW_DOWN)
            expected = [expected[0], expected[2], second] + expected[3:]
            wait_for(pb, lambda d: open_order(d) == expected, f"Alt+Down moved {second!r}: {open_order(pb)}")
            check(bt.focused(pb)["id"] == "done-" + item_id(pb, second), "the focus stays on its box")
            wait_for(pb, lambda d: d.find_element(By.ID, "announce").get_attribute("textContent") == f"Moved {second} to 3 of {len(expected)}.",
                     "the move is said")
            bt.act(lambda: tool(pb, second, "up").click())
            expected = [expected[0], second] + expected[1:2] + expected[3:]
            wait_for(pb, lambda d: open_order(d) == expected, f"Move up: {open_order(pb)}")
            # A finger on a phone: touch events (the handle takes no touch scrolling) drag the top item below the next.
            bt.phone(pb, True)
            pb.execute_cdp_cmd("Emulation.setTouchEmulationEnabled", {"enabled": True, "maxTouchPoints": 1})
            try:
                top = pb.find_element(By.ID, "drag-" + item_id(pb, expected[0])).rect
                below = bt.item_row(pb, expected[1]).rect
                x, y = top["x"] + top["width"] / 2, top["y"] + top["height"] / 2
                to = below["y"] + below["height"] * 0.75
                pb.execute_cdp_cmd("Input.dispatchTouchEvent", {"type": "touchStart", "touchPoints": [{"x": x, "y": y}]})
                for step in range(1, 9):
                    pb.execute_cdp_cmd("Input.dispatchTouchEvent", {"type": "touchMove", "touchPoints": [{"x": x, "y": y + (to - y) * step / 8}]})
                pb.execute_cdp_cmd("Input.dispatchTouchEvent", {"type": "touchEnd", "touchPoints": []})
            finally:
                pb.execute_cdp_cmd("Emulation.setTouchEmulationEnabled", {"enabled": False})
            expected = [expected[1], expected[0]] + expected[2:]
            wait_for(pb, lambda d: open_order(d) == expected, f"dragged with a finger: {open_order(pb)}")
            wait_for(pb, lambda d: pending(d) == 0, "sent")
            wait_for(ob, lambda d: open_order(d) == expected, f"oscar's page follows: {open_order(ob)}")
            oscar.run("sync")
            cli = [i["text"] for i in oscar.json("list", "show", "Market")["items"] if not i["done"]]
            check(cli == expected, f"the CLI's order (by position) is the page's: {cli}")
            bt.phone(pb, False)
            # oscar's CLI moves the last item to the top, unsynced, while paula moves the first one down: both
            # moves stay, and the page and the CLI show one order.
            last, first, second = expected[-1], expected[0], expected[1]
            oscar.run("list", "move", "Market", item_id(pb, last), "1", "--no-sync")
            bt.act(lambda: checkbox(pb, first).send_keys(Keys.ALT, Keys.ARROW_DOWN))
            wait_for(pb, lambda d: open_order(d)[:2] == [second, first] and pending(d) == 0, f"paula's move: {open_order(pb)}")
            oscar.run("sync")
            expected = [last, second, first] + expected[2:-1]
            wait_for(pb, lambda d: open_order(d) == expected, f"both moves: {open_order(pb)}")
            oscar.run("sync")
            cli = [i["text"] for i in oscar.json("list", "show", "Market")["items"] if not i["done"]]
            check(cli == expected, f"the CLI's order is the page's: {cli}")

        def no_room_between_renumbers():
            # Two neighbours whose positions have no double between them: a move between them numbers the unchecked
            # items 1, 2, 3... in the new order.
            paula.run("list", "create", "Order")
            for text in ["One", "Two", "Three", "Four"]:
                paula.run("list", "add", "Order", text)
            ids = {i["text"]: i["id"] for i in paula.json("list", "show", "Order")["items"]}
            squeezed = 2.0000000000000004  # the double right after 2: none lies between them
            private_write(ids["Four"], {"position": {"value": squeezed, "type": "DOUBLE"}})
            open_list(pb, "Order")
            wait_for(pb, lambda d: open_order(d) == ["One", "Two", "Four", "Three"], f"Four squeezed after Two: {open_order(pb)}")
            bt.act(lambda: checkbox(pb, "Three").send_keys(Keys.ALT, Keys.ARROW_UP))
            wait_for(pb, lambda d: open_order(d) == ["One", "Two", "Three", "Four"], f"Three between Two and Four: {open_order(pb)}")
            wait_for(pb, lambda d: pending(d) == 0, "sent")
            paula.run("sync")
            shown = [(i["text"], i["position"]) for i in paula.json("list", "show", "Order")["items"]]
            check(shown == [("One", 1), ("Two", 2), ("Three", 3), ("Four", 4)], f"numbered 1 to 4 in the new order: {shown}")
            if "ob" in state:
                state["ob"].quit()
                drivers.remove(state.pop("ob"))
            open_list(pb, "Market")

        def tags_are_a_set_and_a_list_shows_each_once():
            # The page writes new tags as a set (STRING_SET); tags stored as a list (kind 2, duplicates kept) show
            # each tag once, and the page's tag edits keep them a list: a removal takes every copy, an add appends.
            paula.run("list", "create", "Tags")
            open_list(pb, "Tags")
            bt.type_into(pb, "new-item", "Scarf")
            bt.type_into(pb, "new-item-tags", "wool, blue")
            pb.find_element(By.ID, "new-item").send_keys(Keys.ENTER)
            wait_for(pb, lambda d: ["Scarf", False, ["blue", "wool"]] in bt.items_on_page(d) and pending(d) == 0, "Scarf, tagged, is sent")
            scarf = item_id(pb, "Scarf")
            tags = private_call("records/lookup", {"zoneID": {"zoneName": "Lists"}, "records": [{"recordName": scarf}]})[0]["fields"]["tags"]
            check(tags["type"] == "STRING_SET" and "entries" in tags["crdt"], f"a new item's tags are a set: {tags}")
            private_write(scarf, {"tags": {"value": ["wool", "blue", "wool"], "type": "STRING_LIST"}})
            wait_for(pb, lambda d: len(bt.item_row(d, "Scarf").find_elements(By.CSS_SELECTOR, ".tag")) == 2
                     and len(d.find_elements(By.CSS_SELECTOR, "#items .tag")) == 2, "a list of tags shows each tag once")
            private_write(scarf, {"tags": {"value": ["wool", "blue", "wool", "red"], "type": "STRING_LIST"}})
            wait_for(pb, lambda d: ["Scarf", False, ["blue", "red", "wool"]] in bt.items_on_page(d), "the list's new tag shows")
            chips = [c.text for c in bt.item_row(pb, "Scarf").find_elements(By.CSS_SELECTOR, ".tag > span")]
            check(chips == ["#wool", "#blue", "#red"], f"in the list's order, each once: {chips}")
            bt.act(lambda: bt.item_row(pb, "Scarf").find_element(By.CSS_SELECTOR, "[aria-label='Remove tag wool from Scarf']").click())
            wait_for(pb, lambda d: ["Scarf", False, ["blue", "red"]] in bt.items_on_page(d) and pending(d) == 0, "wool removed")
            bt.act(lambda: tool(pb, "Scarf", "tag").click())
            wait_for(pb, lambda d: d.find_element(By.ID, "tag-input"), "the tag field").send_keys("green", Keys.ENTER)
            wait_for(pb, lambda d: ["Scarf", False, ["blue", "green", "red"]] in bt.items_on_page(d) and pending(d) == 0, "green added")
            tags = private_call("records/lookup", {"zoneID": {"zoneName": "Lists"}, "records": [{"recordName": scarf}]})[0]["fields"]["tags"]
            check(tags["type"] == "STRING_LIST" and tags["value"] == ["blue", "red", "green"] and "runs" in tags["crdt"],
                  f"still a list: every wool gone, green appended: {tags}")
            open_list(pb, "Market")

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

        tests = [
            ("installable: a manifest and a service worker control the page", installable),
            ("the page's join of CRDT states agrees with the server's (seeded random edits)", the_page_joins_as_the_server_does),
            ("the page's join of lists and texts agrees with two servers' (seeded concurrent histories)",
             the_page_joins_lists_and_texts_as_servers_do),
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
            ("a note: two browsers and the CLI edit different paragraphs, offline; all edits stay, the caret moves with the text",
             notes_merge_paragraph_edits_one_offline),
            ("reorder: drag with a mouse and a finger, Alt+Arrow keys, Move up and the CLI; kept after a reload, the same for others",
             drag_and_keys_reorder_items),
            ("reorder: a move where no position fits between the neighbours numbers the items 1 to n", no_room_between_renumbers),
            ("tags: the page writes a set; a list of tags shows each once and stays a list", tags_are_a_set_and_a_list_shows_each_once),
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
        ]
        results = bt.run_suite("web client", [(name, body) for name, body in tests
                                              if not chosen or any(text in name.lower() for text in chosen)])
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
