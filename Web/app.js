// The web client: the account's lists, local-first. Edits apply at once to the browser's replica
// (replica.js, kept in IndexedDB) and are sent as CRDT states when the server can be reached; a service
// worker (sw.js) opens the page offline. The screen is updated in place, row by row, so a field being
// typed in is never rebuilt under the person. Every piece of user text is put on screen with
// textContent, never as HTML.
import { Api, ApiError, currentSession, hashValue, safeNext, takeNext, announceSignIn, uploadFile, downloadPath } from './api.js';
import { followSignInLink } from './signinlink.js';
import { fieldValue, setFields, editSet, editText, newRecord, deletion } from './crdt.js';
import { anchorAt, isText, positionAfter, scalars } from './sequence.js';
import { Replica, isUnreachable } from './replica.js';
import { Store, lastSession, rememberSession, forgetSession } from './store.js';

const LIST_ZONE = 'Lists';
const state = {
  api: null,
  session: null,
  replica: null,
  /** 'lists' (the lists; on a phone the whole screen), 'list' (one list open) or 'share' (its share panel) */
  view: 'lists',
  openList: null,
  /** list id -> title of the lists on screen, to notice the ones that go */
  shownLists: new Map(),
  /** list id -> what this page did to it ("Deleted", "Left"), so its going is said as such */
  deletedHere: new Map(),
  /**
   * an open inline form: {kind: 'title' | 'text' | 'tag' | 'note', id, base, record, stale, confirm, removed};
   * a note's also holds `shown`, the note's state its text box shows, and `composing` (an input method is
   * composing in it)
   */
  editing: null,
  /** the item whose tools are open on a phone */
  menuOpen: null,
  /** the list skeleton on screen: {id, canEdit, owner} */
  built: null,
  /** item id -> {row, signature} */
  rows: new Map(),
  share: null,
  /** a list the address asked for that this browser does not know yet (opened when it arrives) */
  wantedList: null,
  /** the id of the control to focus after the next render */
  focusAfter: null,
  /** item id -> a photo being attached here: {phase: 'asking' | 'sending' | 'failed', sent, total, text} */
  uploads: new Map(),
  /** "item|checksum" -> when its download URL was last asked for again after an image failed to load */
  photoRefreshed: new Map(),
  /** items whose image failed to load while offline: drawn again when the server answers */
  photoRetry: new Set(),
  /** an item being dragged to a new place: {listID, itemID, row, ...} (the items are not redrawn meanwhile) */
  drag: null,
};

const $ = (id) => document.getElementById(id);

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === 'text') node.textContent = value;
    else if (key === 'class') node.className = value;
    else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else if (value === true) node.setAttribute(key, '');
    else if (value !== false && value !== undefined && value !== null) node.setAttribute(key, String(value));
  }
  for (const child of children) if (child) node.append(typeof child === 'string' ? document.createTextNode(child) : child);
  return node;
}

function notice(text, isError = false) {
  const box = $('notice');
  box.textContent = text;
  box.className = 'notice' + (isError ? ' error' : '');
  box.hidden = false;
  clearTimeout(notice.timer);
  notice.timer = setTimeout(() => { box.hidden = true; }, 8000);
}

/** Says a short message through the polite live region (one item's change, not the whole list). */
function announce(text) {
  const region = $('announce');
  region.textContent = '';
  clearTimeout(announce.timer);
  announce.timer = setTimeout(() => { region.textContent = text; }, 50);
}

/** Offers to undo something for 10 s: the bar's Undo button runs `action`. */
function offerUndo(text, label, action) {
  const bar = $('undo');
  $('undo-text').textContent = text;
  const button = $('undo-button');
  button.setAttribute('aria-label', label);
  button.onclick = () => { bar.hidden = true; action(); };
  bar.hidden = false;
  clearTimeout(offerUndo.timer);
  offerUndo.timer = setTimeout(() => { bar.hidden = true; }, 10000);
}

const reasonOf = (error) => (error && (error.reason || error.message)) || 'unknown error';

// MARK: Records as lists and items

const permissionWords = { owner: 'owner', readWrite: 'can edit', readOnly: 'can view' };
const roleWords = { owner: 'owner', administrator: 'administrator', privateUser: 'invited', publicUser: 'joined by link' };

function lists() {
  const result = [];
  for (const zone of state.replica.zones.values()) {
    const records = state.replica.view(zone.key);
    const shares = [...records.values()].filter((r) => r.recordType === 'cloudkit.share' && !r.deleted);
    for (const record of records.values()) {
      if (record.recordType !== 'List' || record.deleted) continue;
      const share = shares.find((s) => fieldValue(s, 'rootRecordName') === record.recordName)
        || shares.find((s) => s.recordName === 'cloudkit.zoneshare');
      let access = 'owner';
      if (zone.database === 'shared') access = (share && permissionOf(share, state.session.userRecordName)) || 'readOnly';
      result.push({
        id: record.recordName, zone, record, share, access, records,
        title: fieldValue(record, 'title') || '',
        owner: zone.database === 'private' ? state.session.name : (zone.ownerName || 'someone'),
      });
    }
  }
  return result.sort((a, b) => a.title.localeCompare(b.title) || a.id.localeCompare(b.id));
}

/** A participant's permission from the share record's entries "userRecordName role permission status". */
function permissionOf(share, user) {
  for (const entry of fieldValue(share, 'participants') || []) {
    const [name, role, permission, status] = String(entry).split(' ');
    if (name === user && status === 'accepted') return role === 'owner' ? 'owner' : permission;
  }
  return null;
}

/** The field an item's photo is kept in: an ASSETID register. */
const PHOTO_FIELD = 'photo';

/** The image names among the CLI's attachments (`lattice list attach`): extensions shown as photos. */
const IMAGE_NAME = /\.(jpe?g|png|gif|webp|avif|heic|heif|bmp)$/i;

/** Lowercase hex of a base64 string (a fileChecksum), as the CLI's attachmentNames entries name them. */
function base64Hex(text) {
  try { return Array.from(atob(text), (c) => c.charCodeAt(0).toString(16).padStart(2, '0')).join(''); } catch { return ''; }
}

/**
 * An item's photo (the ASSETID value: fileChecksum, size, and a downloadURL once the server gave it), or null:
 * its `photo` field, else the first image among the files the CLI attached (`attachments`, an ASSETID list,
 * named in `attachmentNames` as "<SHA-256 hex>/<name>").
 */
function photoOf(record) {
  const value = fieldValue(record, PHOTO_FIELD);
  if (value && typeof value === 'object' && typeof value.fileChecksum === 'string') return value;
  const attached = fieldValue(record, 'attachments');
  if (!Array.isArray(attached)) return null;
  const names = new Map((fieldValue(record, 'attachmentNames') || []).map((entry) => {
    const slash = String(entry).indexOf('/');
    return [String(entry).slice(0, slash), String(entry).slice(slash + 1)];
  }));
  return attached.find((asset) => asset && typeof asset.fileChecksum === 'string'
                       && IMAGE_NAME.test(names.get(base64Hex(asset.fileChecksum)) || '')) || null;
}

/** The field an item's note is kept in: a TEXT, merged character by character. */
const NOTE_FIELD = 'note';

function itemOf(record) {
  const tags = fieldValue(record, 'tags');
  const note = fieldValue(record, NOTE_FIELD);
  const position = Number(fieldValue(record, 'position'));
  return { id: record.recordName, record, text: fieldValue(record, 'text') || '', done: Number(fieldValue(record, 'done') || 0) !== 0,
           // A set holds each tag once; a list (kind 2) may hold one twice: each shows once.
           tags: Array.isArray(tags) ? [...new Set(tags)] : [],
           position: Number.isFinite(position) ? position : 0, photo: photoOf(record),
           note: typeof note === 'string' ? note : '' };
}

/** The open list's items: unchecked first, then checked, each by position. */
function items(list) {
  const all = [...list.records.values()]
    .filter((r) => r.recordType === 'Item' && !r.deleted && r.parent && r.parent.recordName === list.id)
    .map(itemOf)
    .sort((a, b) => (a.done - b.done) || (a.position - b.position) || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  // Names for controls, unique within the list: a second "Milk" is "Milk (2)".
  const seen = new Map();
  for (const item of all) {
    const base = item.text || '(no text)';
    const count = (seen.get(base) || 0) + 1;
    seen.set(base, count);
    item.name = count === 1 ? base : `${base} (${count})`;
  }
  return all;
}

const canEditList = (list) => list.access === 'owner' || list.access === 'readWrite';
const personName = (userRecordName) => (userRecordName === state.session.userRecordName ? 'you'
  : state.replica.names.get(userRecordName) || 'someone');

/** "alice · 5 min ago", from the record's modified user and time; "you · not sent yet" for local edits. */
function changedWords(list, item) {
  if (state.replica.pendingFor(list.zone.key, item.id).length) {
    return 'you · ' + (state.replica.online === false ? 'not sent yet' : 'saving…');
  }
  const modified = item.record.modified;
  if (!modified) return '';
  return `${personName(modified.userRecordName)} · ${when(modified.timestamp)}`;
}

function when(ms) {
  const seconds = Math.max(0, (Date.now() - ms) / 1000);
  if (seconds < 60) return 'just now';
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
  const date = new Date(ms), today = new Date();
  const time = date.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
  if (date.toDateString() === today.toDateString()) return 'today ' + time;
  const yesterday = new Date(today.getTime() - 86400000);
  if (date.toDateString() === yesterday.toDateString()) return 'yesterday ' + time;
  return date.toLocaleDateString([], { day: 'numeric', month: 'short' });
}

// MARK: Edits (applied here at once, kept, and sent when the server can be reached)

function currentList(id = state.openList) { return lists().find((l) => l.id === id); }

function addItem(list, text, tags) {
  const open = items(list).filter((i) => !i.done);
  const position = open.length ? Math.min(...open.map((i) => i.position)) - 1 : 1; // quick-add puts it on top
  const id = randomID('i');
  const record = newRecord(state.replica.clock, {
    recordName: id, recordType: 'Item', zoneID: list.record.zoneID, parent: list.id,
    scalars: { text: [text, 'STRING'], done: [0, 'INT64'], position: [position, 'DOUBLE'] }, sets: { tags } });
  announce(`Added ${text}.`);
  return state.replica.queue(list.zone, [record], [{ operationType: 'forceUpdate', record }], `Add ${text}`);
}

function editRecord(list, recordName, make, label, extra = {}) {
  const current = state.replica.record(list.zone.key, recordName);
  if (!current || current.deleted) return null;
  const record = make(current);
  return state.replica.queue(list.zone, [record], [{ operationType: 'forceUpdate', record }], label, extra);
}

function setDone(list, item, done) {
  announce(`${done ? 'Checked' : 'Unchecked'} ${item.name}.`);
  return editRecord(list, item.id, (r) => setFields(r, state.replica.clock, { done: [done ? 1 : 0, 'INT64'] }),
                    `${done ? 'Check' : 'Uncheck'} ${item.text}`);
}

function setText(list, item, text) {
  announce(`Saved ${text}.`);
  return editRecord(list, item.id, (r) => setFields(r, state.replica.clock, { text: [text, 'STRING'] }), `Edit ${text}`);
}

function changeTags(list, item, add, remove) {
  return editRecord(list, item.id, (r) => editSet(r, state.replica.clock, 'tags', add, remove), `Tag ${item.text}`);
}

function untag(list, item, tag) {
  changeTags(list, item, [], [tag]);
  announce(`Removed tag ${tag} from ${item.name}.`);
  offerUndo(`Removed tag ${tag} from “${item.text}”.`, `Undo removing tag ${tag} from ${item.name}`, () => {
    const again = currentList(list.id);
    const now = again && items(again).find((i) => i.id === item.id);
    if (now) changeTags(again, now, [tag], []);
  });
}

// MARK: Order (each item's `position`, a last-writer-wins DOUBLE register: a move is one write)

/**
 * A `position` strictly between two neighbours' (either may be missing: one past the last, one before the
 * first); null when no double lies between them (the midpoint equals one of them).
 */
function positionBetween(before, after) {
  let position;
  if (before !== undefined && after !== undefined) position = before + (after - before) / 2;
  else if (before !== undefined) position = before + 1;
  else if (after !== undefined) position = after - 1;
  else return null;
  const fits = Number.isFinite(position) && (before === undefined || position > before) && (after === undefined || position < after);
  return fits ? position : null;
}

/**
 * Moves an unchecked item to place `to` (from 0) among the unchecked items: its `position` becomes one between
 * its new neighbours'. When none fits, the unchecked items are numbered 1, 2, 3... in the new order (one
 * change, writing only the positions that change). Concurrent moves and adds converge: each item has one
 * position, whose latest write wins.
 */
function moveItem(list, item, to) {
  const open = items(list).filter((i) => !i.done);
  const from = open.findIndex((i) => i.id === item.id);
  if (from < 0) return;
  const others = open.filter((i) => i.id !== item.id);
  to = Math.max(0, Math.min(others.length, to));
  if (to === from) return;
  const position = positionBetween(others[to - 1] && others[to - 1].position, others[to] && others[to].position);
  const label = `Move ${item.text}`;
  if (position !== null) {
    editRecord(list, item.id, (r) => setFields(r, state.replica.clock, { position: [position, 'DOUBLE'] }), label);
  } else {
    const order = [...others.slice(0, to), item, ...others.slice(to)];
    const states = [];
    order.forEach((each, index) => {
      const record = state.replica.record(list.zone.key, each.id);
      if (record && !record.deleted && each.position !== index + 1) {
        states.push(setFields(record, state.replica.clock, { position: [index + 1, 'DOUBLE'] }));
      }
    });
    if (!states.length) return;
    state.replica.queue(list.zone, states, states.map((record) => ({ operationType: 'forceUpdate', record })), label);
  }
  announce(`Moved ${item.name} to ${to + 1} of ${open.length}.`);
}

/** Alt+ArrowUp / Alt+ArrowDown on an unchecked item's row (its box or buttons) move it one place. */
function moveByKey(event, listID, itemID) {
  if (!event.altKey || (event.key !== 'ArrowUp' && event.key !== 'ArrowDown')) return;
  const target = event.target;
  if (target.tagName === 'TEXTAREA' || (target.tagName === 'INPUT' && target.type !== 'checkbox')) return; // text navigation there
  event.preventDefault();
  moveStep(listID, itemID, event.key === 'ArrowUp' ? -1 : 1);
}

/** Moves an unchecked item one place up (-1) or down (1); at either end it says so. */
function moveStep(listID, itemID, step) {
  const list = currentList(listID);
  if (!list || !canEditList(list)) return;
  const open = items(list).filter((i) => !i.done);
  const from = open.findIndex((i) => i.id === itemID);
  if (from < 0) return;
  if (from + step < 0 || from + step >= open.length) {
    announce(`${open[from].name} is already ${step < 0 ? 'first' : 'last'}.`);
    return;
  }
  moveItem(list, open[from], from + step);
}

/**
 * Dragging an unchecked item by its handle, with pointer events (a mouse, a pen or a finger: the handle takes
 * no touch scrolling): the row follows the pointer, a line shows where it will go, and letting go moves it
 * there. Escape or a cancelled pointer puts it back. The items are not redrawn while it is dragged.
 */
function startDrag(event, listID, itemID) {
  if (event.pointerType === 'mouse' && event.button !== 0) return;
  if (state.drag) return;
  const handle = event.currentTarget;
  const row = handle.closest('li.item');
  const rows = [...$('items').querySelectorAll('li.item')].filter((r) => !r.hidden && !r.classList.contains('done')
                                                                   && !r.classList.contains('removed'));
  const from = rows.indexOf(row);
  if (from < 0) return;
  event.preventDefault();
  const scrollY = () => window.scrollY || 0;
  // Where each row's middle was when the drag began, in page coordinates (the page may scroll meanwhile).
  const middles = rows.map((r) => { const box = r.getBoundingClientRect(); return box.top + scrollY() + box.height / 2; });
  const drag = { listID, itemID, row, rows, from, to: from, startY: event.clientY + scrollY(), lastY: event.clientY,
                 pointerId: event.pointerId, handle, scroller: null };
  state.drag = drag;
  try { handle.setPointerCapture(event.pointerId); } catch (_) { /* a pointer already gone: the drag ends on pointerup anyway */ }
  row.classList.add('dragging');
  const place = () => {
    const dy = drag.lastY + scrollY() - drag.startY;
    row.style.transform = `translateY(${dy}px)`;
    const middle = middles[from] + dy;
    // The new place: how many of the other rows' middles are above the dragged row's.
    let to = 0;
    middles.forEach((m, index) => { if (index !== from && m < middle) to += 1; });
    drag.to = to;
    const others = rows.filter((r) => r !== row);
    others.forEach((r, index) => {
      r.classList.toggle('drop-before', index === to && to !== from);
      r.classList.toggle('drop-after', index === others.length - 1 && to === others.length && to !== from);
    });
  };
  const move = (e) => {
    if (e.pointerId !== drag.pointerId) return;
    drag.lastY = e.clientY;
    place();
    // Near the top or the bottom of the window the page scrolls, so a long list can be crossed.
    const edge = 48, height = window.innerHeight;
    const speed = e.clientY < edge ? -12 : e.clientY > height - edge ? 12 : 0;
    clearInterval(drag.scroller);
    drag.scroller = speed ? setInterval(() => { window.scrollBy(0, speed); place(); }, 30) : null;
  };
  const finish = (moved) => {
    clearInterval(drag.scroller);
    for (const name of ['pointermove', 'pointerup', 'pointercancel']) window.removeEventListener(name, listeners[name]);
    document.removeEventListener('keydown', listeners.keydown, true);
    row.classList.remove('dragging');
    row.style.transform = '';
    for (const r of rows) r.classList.remove('drop-before', 'drop-after');
    state.drag = null;
    const list = currentList(listID);
    const item = list && items(list).find((i) => i.id === itemID && !i.done);
    if (moved && list && item && drag.to !== drag.from) moveItem(list, item, drag.to);
    render();
  };
  const listeners = {
    pointermove: move,
    pointerup: (e) => { if (e.pointerId === drag.pointerId) finish(true); },
    pointercancel: (e) => { if (e.pointerId === drag.pointerId) finish(false); },
    keydown: (e) => { if (e.key === 'Escape') { e.preventDefault(); finish(false); } },
  };
  // On the window: the captured pointer's events reach it through the handle, and any pointer's without capture.
  for (const name of ['pointermove', 'pointerup', 'pointercancel']) window.addEventListener(name, listeners[name]);
  document.addEventListener('keydown', listeners.keydown, true);
}

// MARK: Notes (a TEXT field: each input is a splice of its CRDT state, so edits elsewhere in it stay)

/**
 * An item's note field as a text state; a note not written yet, or not a text (a register someone wrote
 * through the plain API), as an empty one: the first input then writes the whole box as the text.
 */
function noteState(record) {
  const field = record && record.fields && record.fields[NOTE_FIELD];
  return isText(field) ? field : { type: 'TEXT', value: '', crdt: { context: [], runs: [] } };
}

/** UTF-16 offsets (a text box's selection) to Unicode scalars (the server's positions) and back. */
const scalarOffset = (text, offset) => scalars(text.slice(0, offset)).length;
const utf16Offset = (text, count) => scalars(text).slice(0, count).join('').length;

/**
 * The note's text box changed: the change from the text it showed (one splice around the changed middle) is
 * applied to the state it showed, stamped now, and queued; a run of them waits as one change. What others
 * changed meanwhile is in the state the page shows, and stays: the join keeps both.
 */
function noteInput(listID, itemID, input) {
  const editing = state.editing;
  if (!editing || editing.kind !== 'note' || editing.id !== itemID || editing.composing) return;
  const list = currentList(listID);
  const record = list && state.replica.record(list.zone.key, itemID);
  if (!record || record.deleted) return;
  // The splice is made on the state the box showed; a note that is not a text yet is replaced by one.
  const base = isText(record.fields && record.fields[NOTE_FIELD])
    ? { ...record, fields: { ...record.fields, [NOTE_FIELD]: editing.shown } } : record;
  const edit = editText(base, state.replica.clock, NOTE_FIELD, input.value);
  if (!edit) return;
  editing.shown = edit.fields[NOTE_FIELD];
  const item = itemOf(record);
  state.replica.queue(list.zone, [edit], [{ operationType: 'forceUpdate', record: edit }], `Note of ${item.text}`,
                      { coalesce: `note|${list.zone.key}|${itemID}` });
}

/**
 * Shows the note's latest state in its open text box. The caret and the selection stay by the characters
 * they were next to (what was inserted or deleted before them moves them, nothing else does), and the box's
 * scroll stays; nothing is changed while an input method composes in it (it is brought up to date after).
 */
function syncNote(item) {
  const editing = state.editing;
  const input = $('note-input');
  if (!editing || editing.kind !== 'note' || !input || editing.composing) return;
  if (!isText(item.record.fields && item.record.fields[NOTE_FIELD])) return; // not a text (yet): the box keeps what it shows
  const latest = noteState(item.record);
  if (input.value === latest.value) { editing.shown = latest; return; }
  const focused = document.activeElement === input;
  const { selectionStart, selectionEnd, selectionDirection, scrollTop } = input;
  const shown = editing.shown;
  const start = anchorAt(shown, scalarOffset(input.value, selectionStart));
  const end = anchorAt(shown, scalarOffset(input.value, selectionEnd));
  input.value = latest.value;
  editing.shown = latest;
  input.scrollTop = scrollTop;
  if (focused) {
    const at = (anchor) => utf16Offset(latest.value, positionAfter(latest, anchor) ?? scalars(latest.value).length);
    input.setSelectionRange(at(start), Math.max(at(start), at(end)), selectionDirection);
  }
}

/** The note's first line, shortened, for the item's row. */
function notePreview(note) {
  const line = note.split('\n').map((l) => l.trim()).find(Boolean) || '';
  const shown = scalars(line);
  return shown.length > 80 ? shown.slice(0, 79).join('') + '…' : line;
}

/** Deletes items (one queued change); Undo takes it back if unsent, else brings the items back. */
function removeItems(list, removed, text, label) {
  if (state.editing && state.editing.kind === 'note' && removed.some((item) => item.id === state.editing.id)) state.editing = null;
  const states = removed.map((item) => deletion(item.record, state.replica.clock));
  const operations = removed.map((item) => ({ operationType: 'forceDelete', record: { recordName: item.id } }));
  const entry = state.replica.queue(list.zone, states, operations, label, { kind: 'delete' });
  announce(text);
  offerUndo(text, `Undo: ${label}`, async () => {
    if (await state.replica.cancel(entry)) { announce('Brought back.'); return; }
    const again = currentList(list.id) || list;
    restoreItems(again, removed.map((item) => ({ ...item, generation: (item.record.crdt.generation || 1) + 1 })));
    announce('Brought back.');
  });
}

/** Makes items again (a new generation of each), with the text, check, tags, note and place they had. */
function restoreItems(list, wanted) {
  const records = wanted.map((item) => {
    // The generation after the removed one (or the one someone brought back meanwhile, joined with it).
    const now = state.replica.record(list.zone.key, item.id);
    const known = now ? (now.crdt.generation || 1) + (now.deleted ? 1 : 0) : 1;
    const generation = Math.max(item.generation || 1, known);
    return newRecord(state.replica.clock, {
      recordName: item.id, recordType: 'Item', zoneID: list.record.zoneID, parent: list.id, generation,
      scalars: { text: [item.text, 'STRING'], done: [item.done ? 1 : 0, 'INT64'], position: [item.position, 'DOUBLE'] },
      sets: { tags: item.tags }, texts: { [NOTE_FIELD]: item.note || '' } });
  });
  const entry = state.replica.queue(list.zone, records, records.map((record) => ({ operationType: 'forceUpdate', record })),
                                    `Restore ${wanted.map((i) => i.text).join(', ')}`);
  // A photo comes back in a change of its own: saving an asset into a record needs the writer's claim on it
  // (they uploaded it within the server's grace period), and a refusal of the photo must not keep the item
  // from coming back. It is then said as such (`refused`).
  for (const item of wanted) {
    if (!item.photo) continue;
    const photo = { fileChecksum: item.photo.fileChecksum, size: item.photo.size };
    editRecord(list, item.id, (r) => setFields(r, state.replica.clock, { [PHOTO_FIELD]: [photo, 'ASSETID'] }),
               `Bring back the photo of ${item.text}`, { kind: 'photo', itemText: item.text });
  }
  return entry;
}

function removeItem(list, item) {
  // The focus goes on to the next item's box (or the previous one's, or the new-item field).
  const all = items(list);
  const at = all.findIndex((i) => i.id === item.id);
  const neighbour = all[at + 1] || all[at - 1];
  state.focusAfter = neighbour ? 'done-' + neighbour.id : 'new-item';
  removeItems(list, [item], `Removed “${item.text}”.`, `remove ${item.name}`);
}

function clearChecked(list) {
  const checked = items(list).filter((i) => i.done);
  if (!checked.length) return;
  state.focusAfter = 'new-item';
  removeItems(list, checked, `Cleared ${checked.length} checked ${checked.length === 1 ? 'item' : 'items'}.`, 'clear the checked items');
}

function rename(list, title) {
  return editRecord(list, list.id, (r) => setFields(r, state.replica.clock, { title: [title, 'STRING'] }), `Rename ${title}`);
}

function deleteList(list) {
  state.deletedHere.set(list.id, 'Deleted');
  const all = items(list);
  const states = [...all.map((i) => deletion(i.record, state.replica.clock)), deletion(list.record, state.replica.clock)];
  const operations = states.map((s) => ({ operationType: 'forceDelete', record: { recordName: s.recordName } }));
  state.replica.queue(list.zone, states, operations, `Delete ${list.title}`, { kind: 'delete' });
  go('lists', null, { replace: true });
}

// MARK: Photos (an ASSETID field of the item: the bytes go to the server first, then the field is an edit)

const megabytes = (bytes) => (bytes >= 1e6 ? `${(bytes / 1e6).toFixed(1)} MB` : `${Math.max(1, Math.round(bytes / 1e3))} kB`);

/** What the row says about its photo: an upload under way or failed, or a photo not on the server yet. */
function photoStatus(list, item) {
  const upload = state.uploads.get(item.id);
  if (upload) {
    if (upload.phase === 'failed') return { text: upload.text, error: true };
    if (upload.phase === 'asking') return { text: 'Sending the photo…' };
    const percent = upload.total ? Math.floor((100 * upload.sent) / upload.total) : 0;
    return { text: `Sending the photo: ${percent} % of ${megabytes(upload.total)}` };
  }
  if (item.photo && !item.photo.downloadURL) {
    if (!state.replica.pendingFor(list.zone.key, item.id).length) return null;
    return { text: state.replica.online === false ? 'Photo sent; it is attached when you are back online.' : 'Saving the photo…' };
  }
  return null;
}

/** The Photo button: offline it says a photo needs a connection, else it opens the camera or the picker. */
function choosePhoto(list, item) {
  if (state.replica.online === false || navigator.onLine === false) {
    notice('Adding a photo needs a connection: you are offline. Try again when you are back online.', true);
    return;
  }
  const upload = state.uploads.get(item.id);
  if (upload && upload.phase !== 'failed') { notice(`The photo of “${item.text}” is still being sent.`); return; }
  const input = $('photo-input-' + item.id);
  if (input) input.click();
}

/** Asks a database operation; a refused CSRF value (the session was renewed elsewhere) is asked again once. */
async function callWithSession(database, operation, body) {
  if (!state.api.session.csrfToken) await state.replica.refreshSession();
  try {
    return await state.api.call(database, operation, body);
  } catch (error) {
    if (!(error instanceof ApiError) || error.status !== 403) throw error;
    await state.replica.refreshSession();
    return state.api.call(database, operation, body);
  }
}

/**
 * Attaches a photo to an item: `assets/upload` names the item's `photo` field and answers an upload URL, the
 * file's bytes go there (streamed by the browser, with progress on the row), and the receipt's dictionary
 * is saved into the field as any edit is (a last-writer-wins register, queued and sent in order). The
 * upload itself needs the server: offline, or when it fails, the page says so and nothing is queued.
 */
async function attachPhoto(listID, itemID, file) {
  const list = currentList(listID);
  const item = list && items(list).find((i) => i.id === itemID);
  if (!list || !item || !file) return;
  const fail = (text) => {
    state.uploads.set(itemID, { phase: 'failed', text });
    notice(text, true);
    render();
  };
  if (file.type && !file.type.startsWith('image/')) {
    fail(`Photo not added to “${item.text}”: “${file.name}” is not an image.`);
    return;
  }
  const previous = state.uploads.get(itemID);
  if (previous && previous.phase === 'failed' && $('notice').textContent === previous.text) $('notice').hidden = true; // tried again
  const upload = { phase: 'asking', sent: 0, total: file.size };
  state.uploads.set(itemID, upload);
  announce(`Sending the photo of ${item.name}.`);
  render();
  try {
    const reply = await callWithSession(list.zone.database, 'assets/upload', {
      zoneID: list.zone.zoneID, tokens: [{ recordType: 'Item', recordName: itemID, fieldName: PHOTO_FIELD }] });
    const token = (reply.tokens || [])[0] || {};
    if (!token.url) throw new ApiError(token.serverErrorCode || 'BAD_REQUEST', token.reason || 'the server gave no upload URL', 400);
    upload.phase = 'sending';
    render();
    let shown = -1;
    const asset = await uploadFile(token.url, file, (sent, total) => {
      upload.sent = sent;
      upload.total = total;
      const percent = total ? Math.floor((100 * sent) / total) : 0;
      if (percent === shown) return;
      shown = percent; // the row's line only, not the whole screen, for each step
      const line = $('photo-status-' + itemID);
      const status = photoStatus(list, item);
      if (line && status) line.textContent = status.text;
    });
    state.uploads.delete(itemID);
    const now = currentList(listID);
    const entry = now && editRecord(now, itemID, (r) => setFields(r, state.replica.clock, { [PHOTO_FIELD]: [asset, 'ASSETID'] }),
                                    `Photo of ${item.text}`, { kind: 'photo', itemText: item.text });
    if (!entry) { fail(`Photo not added: “${item.text}” was removed meanwhile.`); return; }
    announce(`Added the photo to ${item.name}.`);
  } catch (error) {
    const noConnection = !(error instanceof ApiError) || error.status === 0;
    fail(noConnection ? `Photo not added to “${item.text}”: adding a photo needs a connection. Try again when you are online.`
      : isUnreachable(error) ? `Photo not added to “${item.text}”: the server cannot take it now (${reasonOf(error)}). Try again in a moment.`
        : `Photo not added to “${item.text}”: ${reasonOf(error)}`);
  }
}

/**
 * A thumbnail that did not load: its download URL expired (they work for an hour, and a kept state holds the
 * last one given), access changed, or the page is offline. The record is asked for again once (per photo,
 * every ten minutes at most) for a fresh URL; offline, the row is drawn again when the server answers.
 */
async function photoFailed(listID, itemID, checksum) {
  if (state.replica.online === false) { state.photoRetry.add(itemID); return; }
  const key = `${itemID}|${checksum}`;
  const last = state.photoRefreshed.get(key);
  if (last && Date.now() - last < 10 * 60 * 1000) return;
  state.photoRefreshed.set(key, Date.now());
  const list = currentList(listID);
  if (!list) return;
  try { await state.replica.refresh(list.zone, [itemID]); } catch (error) {
    state.photoRefreshed.delete(key);
    state.replica.failed(error);
    if (isUnreachable(error)) state.photoRetry.add(itemID);
  }
}

/** The item's photo as a thumbnail that opens the whole image (in a new tab: the list stays open). */
function photoThumbnail(list, item) {
  const name = (item.text.replace(/[^\p{L}\p{N} ._-]+/gu, ' ').trim().slice(0, 80) || 'photo');
  const url = downloadPath(item.photo.downloadURL, name);
  const image = el('img', { src: url, alt: `Photo of ${item.name}`, loading: 'lazy', class: 'thumb', id: 'photo-image-' + item.id,
                            width: 48, height: 48, decoding: 'async' });
  image.addEventListener('error', () => photoFailed(list.id, item.id, item.photo.fileChecksum));
  return el('a', { href: url, class: 'thumb-link', id: 'photo-link-' + item.id, target: '_blank', rel: 'noopener' }, image);
}

function randomID(prefix) {
  const bytes = new Uint8Array(6);
  crypto.getRandomValues(bytes);
  return prefix + Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
}

async function createList(title) {
  let zone = [...state.replica.zones.values()].find((z) => z.database === 'private' && z.zoneID.zoneName === LIST_ZONE);
  try {
    if (!zone) {
      const reply = await state.api.call('private', 'zones/modify', { operations: [{ operationType: 'create', zone: { zoneID: { zoneName: LIST_ZONE } } }] });
      const made = ((reply.zones || [])[0] || {}).zoneID || { zoneName: LIST_ZONE, ownerRecordName: state.session.userRecordName };
      zone = state.replica.addZone('private', made);
    }
  } catch (error) {
    notice(isUnreachable(error) ? 'Your first list needs a connection: try again when you are online.'
      : 'Not created: ' + reasonOf(error), true);
    return;
  }
  const id = randomID('l');
  const zoneID = { zoneName: zone.zoneID.zoneName, ownerRecordName: zone.zoneID.ownerRecordName || state.session.userRecordName };
  const record = newRecord(state.replica.clock, { recordName: id, recordType: 'List', zoneID, scalars: { title: [title, 'STRING'] } });
  state.replica.queue(zone, [record], [{ operationType: 'forceUpdate', record }], `Create ${title}`);
  state.focusAfter = 'new-item'; // the next thing to do: add its first item
  go('list', id);
}

// MARK: Navigation (history entries: lists <-> a list <-> its share panel)

function hashFor(view, id) {
  if (view === 'lists' || !id) return '/';
  return '/#list=' + encodeURIComponent(id) + (view === 'share' ? '&share' : '');
}

/** Shows a view; a new history entry unless `replace`, so Back goes back inside the app. */
function go(view, id = state.openList, { replace = false } = {}) {
  if (view !== 'lists' && !id) view = 'lists';
  const from = { view: state.view, id: state.openList };
  const changedList = (view === 'lists' ? null : id) !== state.openList;
  state.view = view;
  state.openList = view === 'lists' ? null : id;
  if (changedList) { state.editing = null; state.menuOpen = null; }
  if (view !== 'share') state.share = null;
  const url = hashFor(view, state.openList);
  if (replace) history.replaceState({ view, id: state.openList, from: history.state && history.state.from }, '', url);
  else history.pushState({ view, id: state.openList, from }, '', url);
  const wantedFocus = state.focusAfter;
  render();
  if (wantedFocus) return;
  // The focus moves to the view that opened (a region named by its heading), as a screen reader expects.
  if (view === 'lists' && !isWide()) focusStatic($('lists-view'));
  if (view === 'list' && changedList) focusStatic($('main'));
  if (view === 'share') focusStatic($('share-panel'));
}

/** Moves the focus to a region (a view that opened), for as long as it keeps it. */
function focusStatic(node) {
  if (!node) return;
  node.setAttribute('tabindex', '-1');
  node.addEventListener('blur', () => node.removeAttribute('tabindex'), { once: true });
  node.focus();
}

const isWide = () => window.matchMedia('(min-width: 48rem)').matches;

/** The view an address names (on load, and when Back or Forward moves through the app's entries). */
function fromAddress() {
  const id = hashValue('list');
  if (id && lists().some((l) => l.id === id)) {
    state.openList = id;
    state.view = hashValue('share') !== null ? 'share' : 'list';
  } else {
    state.view = 'lists';
    state.openList = null;
  }
  state.editing = null;
  if (state.view !== 'share') state.share = null;
}

// MARK: Rendering

/**
 * Updates the screen from the replica in place: the lists, the open list's skeleton (built once per list
 * and access), and each item's row (rebuilt only when it changed, never an open form). Controls keep
 * stable ids, so the focus stays put; `state.focusAfter` moves it on purpose.
 */
function render() {
  const active = document.activeElement;
  const focusedID = active && active.id;
  renderNav();
  renderMain();
  const layout = $('layout');
  layout.dataset.view = state.view;
  const list = currentList();
  document.title = (state.view === 'share' && list ? `Share ${list.title}` : list ? list.title || '(untitled)' : 'Lists') + ' · Lattice';
  const target = (state.focusAfter && $(state.focusAfter)) || (focusedID && active !== document.activeElement && $(focusedID));
  state.focusAfter = null;
  if (target && target !== document.activeElement && target.getClientRects().length) target.focus();
}

function renderNav() {
  const all = lists();
  // Lists that went away: deleted elsewhere, or our access to them removed.
  const now = new Map(all.map((l) => [l.id, l.title]));
  for (const [id, title] of state.shownLists) {
    if (now.has(id)) continue;
    if (state.deletedHere.has(id)) { notice(`${state.deletedHere.get(id)} “${title}”.`); state.deletedHere.delete(id); }
    else notice(`“${title}” is no longer available: it was deleted, or you were removed from its share.`);
    if (state.openList === id) {
      state.openList = null;
      state.share = null;
      state.editing = null;
      state.view = 'lists';
      history.replaceState({ view: 'lists' }, '', '/');
    }
  }
  state.shownLists = now;
  // The page's one <h1>: "Lists" while no list is open, else the open list's title.
  const wantTag = state.openList ? 'H2' : 'H1';
  const heading = $('lists-heading');
  if (heading.tagName !== wantTag) {
    const replacement = el(wantTag.toLowerCase(), { id: 'lists-heading', text: 'Lists' });
    heading.replaceWith(replacement);
  }
  const nav = $('lists');
  const existing = new Map([...nav.children].map((li) => [li.dataset.list, li]));
  const rows = all.map((list) => {
    const meta = `${list.owner} · ${permissionWords[list.access] || list.access}`;
    const signature = JSON.stringify([list.title, meta, list.id === state.openList]);
    let li = existing.get(list.id);
    if (li && li.dataset.signature === signature) return li;
    const button = el('button', { type: 'button', id: 'list-' + list.id, class: 'list-link' + (list.id === state.openList ? ' current' : ''),
                                  'aria-current': list.id === state.openList ? 'true' : false, 'data-list': list.id,
                                  onclick: () => go('list', list.id) },
      el('span', { class: 'title', dir: 'auto', text: list.title || '(untitled)' }),
      el('span', { class: 'meta', dir: 'auto', text: meta }));
    if (li) li.replaceChildren(button); else li = el('li', { 'data-list': list.id }, button);
    li.dataset.signature = signature;
    return li;
  });
  placeChildren(nav, rows);
}

/**
 * Puts `wanted` in `parent` in order, removing the rest. The row holding the focus is never moved
 * (moving it would take the focus and the caret away): the others move around it.
 */
function placeChildren(parent, wanted) {
  const keep = new Set(wanted);
  for (const child of [...parent.children]) if (!keep.has(child)) child.remove();
  const anchorIndex = wanted.findIndex((node) => node.contains(document.activeElement) && node.parentNode === parent);
  // Before the anchor (or all, without one): a cursor walks the children; a node not at it is put there.
  // The cursor never passes the anchor, so the anchor is never moved.
  let cursor = parent.firstChild;
  for (let i = 0; i < (anchorIndex < 0 ? wanted.length : anchorIndex); i += 1) {
    if (wanted[i] === cursor) cursor = cursor.nextSibling;
    else parent.insertBefore(wanted[i], cursor);
  }
  if (anchorIndex < 0) return;
  let previous = wanted[anchorIndex];
  for (let i = anchorIndex + 1; i < wanted.length; i += 1) {
    if (previous.nextSibling !== wanted[i]) parent.insertBefore(wanted[i], previous.nextSibling);
    previous = wanted[i];
  }
}

function renderMain() {
  const main = $('list');
  const list = currentList();
  if (!list) {
    if (state.built || !main.querySelector('#empty')) {
      state.built = null;
      state.rows.clear();
      main.replaceChildren(el('p', { class: 'help', id: 'empty', text: 'Choose a list, or create one.' }));
    }
    $('main').removeAttribute('aria-labelledby');
    $('main').setAttribute('aria-label', 'List');
    return;
  }
  if (!list.zone.complete && !items(list).length) {
    // Its items are still coming (a first load fetches the titles first).
    if (!main.querySelector('#loading')) {
      state.built = null;
      state.rows.clear();
      main.replaceChildren(el('p', { class: 'help', id: 'loading', role: 'status', dir: 'auto', text: `Loading “${list.title}”…` }));
    }
    return;
  }
  const canEdit = canEditList(list);
  if (!state.built || state.built.id !== list.id || state.built.canEdit !== canEdit || state.built.access !== list.access) {
    buildList(main, list, canEdit);
  }
  $('main').removeAttribute('aria-label');
  $('main').setAttribute('aria-labelledby', 'list-title');
  $('list-title').textContent = list.title || '(untitled)';
  $('list-access').textContent = `${list.owner} · ${permissionWords[list.access] || list.access}`;
  renderRenameForm(list);
  renderShare(list);
  renderItems(list, canEdit);
}

function buildList(main, list, canEdit) {
  state.built = { id: list.id, canEdit, access: list.access };
  state.rows.clear();
  const back = el('button', { type: 'button', class: 'button secondary back', id: 'back-to-lists', 'aria-label': 'Back to your lists',
                              onclick: () => backTo('lists') }, '‹ Lists');
  const heading = el('div', { class: 'list-head' }, back,
    el('div', { class: 'list-head-text' },
      el('h1', { id: 'list-title', dir: 'auto', text: list.title || '(untitled)' }),
      el('p', { class: 'meta', id: 'list-access', dir: 'auto' })));
  const tools = el('div', { class: 'tools', id: 'list-tools' });
  if (canEdit) {
    tools.append(el('button', { type: 'button', class: 'button secondary', id: 'rename', 'aria-label': `Rename ${list.title}`, onclick: () => {
      state.editing = { kind: 'title', id: list.id };
      render();
      $('rename-input').focus();
    } }, 'Rename'));
  }
  const shareLabel = list.access === 'owner' ? 'Share' : 'People';
  tools.append(el('button', { type: 'button', class: 'button secondary', id: 'share-button', 'aria-expanded': 'false', 'aria-controls': 'share-slot',
    onclick: () => { if (state.view === 'share') backTo('list'); else go('share', list.id); } }, shareLabel));
  if (list.access === 'owner') {
    tools.append(confirmButton('delete-list', 'Delete list', `Delete “${list.title}” and its items`, () => deleteList(list)));
  } else {
    tools.append(confirmButton('leave', 'Leave', `Leave “${list.title}”`, () => leave(list)));
  }
  const children = [heading, tools, el('div', { id: 'rename-slot' }), el('div', { id: 'share-slot' })];
  if (canEdit) children.push(renderAddForm(list));
  const section = el('section', { id: 'items-section', 'aria-label': 'Items' },
    el('ul', { id: 'items', class: 'items' }), el('p', { class: 'help', id: 'no-items', text: 'No items yet.', hidden: true }));
  children.push(section);
  main.replaceChildren(...children);
}

/** Goes up to a view: Back when the entry before is that view (so history stays short), else to it. */
function backTo(view) {
  const from = history.state && history.state.from;
  if (from && from.view === view && (view === 'lists' || from.id === state.openList)) { history.back(); return; }
  go(view, state.openList, { replace: true });
}

function renderRenameForm(list) {
  const slot = $('rename-slot');
  const editingTitle = state.editing && state.editing.kind === 'title' && state.editing.id === list.id;
  if (editingTitle && !$('rename-form')) {
    slot.replaceChildren(editForm('rename', `New title for ${list.title}`, list.title, 'rename', (title) => rename(list, title),
                                  { save: `Save the title of ${list.title}`, cancel: 'Cancel renaming' }));
  } else if (!editingTitle && slot.firstChild) {
    slot.replaceChildren();
  }
}

function renderItems(list, canEdit) {
  if (state.drag) return; // drawn when the drag ends
  const all = items(list);
  const open = all.filter((i) => !i.done), checked = all.filter((i) => i.done);
  const collapsed = checkedCollapsed(list.id);
  const wanted = [];
  const seen = new Set();
  for (const item of open) { wanted.push(renderRow(list, item, canEdit, false)); seen.add(item.id); }
  if (checked.length) wanted.push(checkedHeader(list, checked.length, collapsed, canEdit));
  for (const item of checked) { wanted.push(renderRow(list, item, canEdit, collapsed)); seen.add(item.id); }
  // An item removed while its text was being edited stays, with the person's text and Restore.
  if (state.editing && state.editing.kind === 'text' && !seen.has(state.editing.id) && state.rows.has(state.editing.id)) {
    const row = state.rows.get(state.editing.id).row;
    markRemoved(list, row);
    wanted.push(row);
    seen.add(state.editing.id);
  }
  // An item removed (elsewhere) while its note was open: the note closes, and Undo brings the item back with it.
  if (state.editing && state.editing.kind === 'note' && !seen.has(state.editing.id)) {
    const gone = state.editing.item;
    state.editing = null;
    if (gone) {
      const who = removerName(list, gone.id);
      notice(`${who} removed “${gone.text}” while you were editing its note: Undo brings it back with the note.`);
      offerUndo(`“${gone.text}” was removed.`, `Bring back ${gone.name} with its note`,
                () => restoreItems(currentList(list.id) || list, [{ ...gone, generation: (gone.record.crdt.generation || 1) + 1 }]));
    }
  }
  for (const id of [...state.rows.keys()]) if (!seen.has(id)) state.rows.delete(id);
  placeChildren($('items'), wanted);
  $('no-items').hidden = all.length > 0 || wanted.length > 0;
}

const COLLAPSED_KEY = 'lattice.checkedCollapsed';
function checkedCollapsed(listID) {
  try { return (JSON.parse(localStorage.getItem(COLLAPSED_KEY) || '[]')).includes(listID); } catch (_) { return false; }
}
function setCheckedCollapsed(listID, collapsed) {
  let ids = [];
  try { ids = JSON.parse(localStorage.getItem(COLLAPSED_KEY) || '[]'); } catch (_) { ids = []; }
  ids = ids.filter((id) => id !== listID);
  if (collapsed) ids.push(listID);
  localStorage.setItem(COLLAPSED_KEY, JSON.stringify(ids.slice(-200)));
}

function checkedHeader(list, count, collapsed, canEdit) {
  let li = $('checked-header');
  const signature = JSON.stringify([list.id, count, collapsed, canEdit]);
  if (li && li.dataset.signature === signature) return li;
  const toggle = el('button', { type: 'button', class: 'button small secondary', id: 'toggle-checked', 'aria-expanded': String(!collapsed),
                                'aria-label': `${collapsed ? 'Show' : 'Hide'} the ${count} checked ${count === 1 ? 'item' : 'items'}`,
                                onclick: () => { setCheckedCollapsed(list.id, !collapsed); state.focusAfter = 'toggle-checked'; render(); } },
    collapsed ? 'Show' : 'Hide');
  const children = [el('span', { class: 'checked-count', text: `Checked (${count})` }), toggle];
  if (canEdit) {
    children.push(el('button', { type: 'button', class: 'button small danger', id: 'clear-checked',
                                 onclick: () => clearChecked(currentList(list.id) || list) }, 'Clear checked'));
  }
  if (li) li.replaceChildren(...children); else li = el('li', { id: 'checked-header', class: 'checked-header' }, ...children);
  li.dataset.signature = signature;
  return li;
}

function renderRow(list, item, canEdit, hidden) {
  const editing = state.editing && state.editing.id === item.id && ['text', 'tag', 'note'].includes(state.editing.kind) ? state.editing : null;
  const words = changedWords(list, item);
  const upload = state.uploads.get(item.id);
  const noteOpen = !!(editing && editing.kind === 'note');
  const signature = JSON.stringify([item.text, item.done, item.tags, item.name, words, canEdit, state.menuOpen === item.id,
                                    item.photo && [item.photo.fileChecksum, item.photo.downloadURL || null],
                                    upload ? [upload.phase, upload.text || null] : null,
                                    canEdit ? notePreview(item.note) : item.note, noteOpen]);
  let known = state.rows.get(item.id);
  if (!known) {
    const row = el('li', { class: 'item', 'data-item': item.id, id: 'item-' + item.id },
      el('div', { class: 'item-row' }), el('div', { class: 'item-form' }));
    const listID = list.id;
    row.addEventListener('keydown', (event) => { if (!row.classList.contains('done')) moveByKey(event, listID, item.id); });
    known = { row, signature: null };
    state.rows.set(item.id, known);
  }
  const row = known.row;
  row.hidden = hidden && !(editing);
  row.classList.toggle('done', item.done);
  row.classList.toggle('open', state.menuOpen === item.id);
  row.classList.remove('removed');
  if (known.signature !== signature) {
    known.signature = signature;
    row.firstChild.replaceChildren(...rowContents(list, item, canEdit, words));
  }
  renderRowForm(list, item, row.lastChild, editing, canEdit);
  return row;
}

function rowContents(list, item, canEdit, words) {
  const noteOpen = !!(state.editing && state.editing.kind === 'note' && state.editing.id === item.id);
  const box = el('input', { type: 'checkbox', id: 'done-' + item.id, checked: item.done, disabled: !canEdit,
                            'aria-label': item.name !== item.text ? item.name : false,
                            onchange: (event) => { const now = currentList(list.id); if (now) setDone(now, item, event.target.checked); } });
  const tags = el('span', { class: 'tags' });
  item.tags.forEach((tag, index) => {
    const chip = el('span', { class: 'tag' }, el('span', { dir: 'auto', text: '#' + tag }));
    if (canEdit) {
      chip.append(el('button', { type: 'button', class: 'tag-remove', id: `untag-${item.id}-${index}`,
                                 'aria-label': `Remove tag ${tag} from ${item.name}`, onclick: () => {
                                   state.focusAfter = 'tag-' + item.id;
                                   const now = currentList(list.id);
                                   if (now) untag(now, item, tag);
                                 } }, '×'));
    }
    tags.append(chip);
  });
  const body = el('div', { class: 'item-body' },
    el('label', { for: 'done-' + item.id, class: 'text', dir: 'auto', text: item.text }),
    tags);
  // The note: its first line for an editor (Note opens it whole), all of it for a reader.
  if (item.note) {
    body.append(canEdit ? el('span', { class: 'note-preview', id: 'note-preview-' + item.id, dir: 'auto', text: notePreview(item.note) })
      : el('span', { class: 'note-full', id: 'note-preview-' + item.id, dir: 'auto', text: item.note }));
  }
  body.append(el('span', { class: 'meta changed', id: 'changed-' + item.id, dir: 'auto', text: words }));
  const status = photoStatus(list, item);
  if (status) body.append(el('span', { class: 'photo-status' + (status.error ? ' error' : ' meta'), id: 'photo-status-' + item.id, dir: 'auto', text: status.text }));
  const contents = [box, body];
  if (canEdit && !item.done) {
    // The drag handle: for a pointer (a finger on a phone); the keyboard has Alt+Up/Down and the Move buttons.
    const handle = el('span', { class: 'drag-handle', id: 'drag-' + item.id, 'aria-hidden': 'true', title: 'Drag to move' }, '≡');
    handle.addEventListener('pointerdown', (event) => startDrag(event, list.id, item.id));
    contents.unshift(handle);
  } else if (canEdit) {
    contents.unshift(el('span', { class: 'drag-spacer', 'aria-hidden': 'true' })); // a checked item lines up with the others
  }
  if (item.photo && item.photo.downloadURL) contents.push(photoThumbnail(list, item));
  if (canEdit) {
    contents.push(el('button', { type: 'button', class: 'button small secondary more', id: 'more-' + item.id,
                                 'aria-expanded': String(state.menuOpen === item.id), 'aria-controls': 'tools-' + item.id,
                                 'aria-label': `Actions for ${item.name}`, onclick: () => {
                                   state.menuOpen = state.menuOpen === item.id ? null : item.id;
                                   state.focusAfter = state.menuOpen ? 'edit-' + item.id : 'more-' + item.id;
                                   render();
                                 } }, '⋯'));
    contents.push(el('span', { class: 'item-tools', id: 'tools-' + item.id },
      el('button', { type: 'button', class: 'button small secondary edit', id: 'edit-' + item.id, 'aria-label': `Edit ${item.name}`, onclick: () => {
        const now = itemNow(list, item.id);
        if (!now) return;
        state.editing = { kind: 'text', id: item.id, base: now.text, item: now, stale: false, confirm: false, removed: false };
        render();
        const input = $('edit-input');
        if (input) input.focus();
      } }, 'Edit'),
      el('button', { type: 'button', class: 'button small secondary note', id: 'note-' + item.id, 'aria-label': `Open the note of ${item.name}`,
                     'aria-controls': noteOpen ? 'note-panel' : false, 'aria-expanded': String(noteOpen), onclick: () => {
        const now = itemNow(list, item.id);
        if (!now) return;
        if (state.editing && state.editing.kind === 'note' && state.editing.id === item.id) {
          state.editing = null;
          state.focusAfter = 'note-' + item.id;
        } else {
          state.editing = { kind: 'note', id: item.id, item: now, shown: noteState(now.record), composing: false };
          state.focusAfter = 'note-input';
        }
        render();
      } }, 'Note'),
      el('button', { type: 'button', class: 'button small secondary add-tag', id: 'tag-' + item.id, 'aria-label': `Add a tag to ${item.name}`, onclick: () => {
        state.editing = { kind: 'tag', id: item.id };
        render();
        const input = $('tag-input');
        if (input) input.focus();
      } }, '+ Tag'),
      el('button', { type: 'button', class: 'button small secondary photo', id: 'photo-' + item.id,
                     'aria-label': item.photo ? `Change the photo of ${item.name}` : `Add a photo to ${item.name}`,
                     onclick: () => choosePhoto(list, item) }, 'Photo'),
      el('input', { type: 'file', accept: 'image/*', capture: 'environment', hidden: true, id: 'photo-input-' + item.id,
                    'aria-label': `Photo for ${item.name}`, onchange: (event) => {
                      const file = event.target.files && event.target.files[0];
                      event.target.value = ''; // the same file chosen again is a new choice
                      if (file) attachPhoto(list.id, item.id, file);
                    } }),
      ...(item.done ? [] : [
        el('button', { type: 'button', class: 'button small secondary move', id: 'up-' + item.id, 'aria-label': `Move ${item.name} up`,
                       'aria-keyshortcuts': 'Alt+ArrowUp', onclick: () => moveStep(list.id, item.id, -1) }, '↑'),
        el('button', { type: 'button', class: 'button small secondary move', id: 'down-' + item.id, 'aria-label': `Move ${item.name} down`,
                       'aria-keyshortcuts': 'Alt+ArrowDown', onclick: () => moveStep(list.id, item.id, 1) }, '↓')]),
      el('button', { type: 'button', class: 'button small danger remove', id: 'remove-' + item.id, 'aria-label': `Remove ${item.name}`,
                     onclick: () => { const now = currentList(list.id); if (now) removeItem(now, item); } }, 'Remove')));
  }
  return contents;
}

function itemNow(list, id) {
  const now = currentList(list.id);
  return now ? items(now).find((i) => i.id === id) : null;
}

/** The inline form under a row: made when it opens, kept (never rebuilt) while it stays open. */
function renderRowForm(list, item, slot, editing, canEdit) {
  if (!editing || !canEdit) { if (slot.firstChild) slot.replaceChildren(); return; }
  if (editing.kind === 'note') {
    if (!slot.querySelector('.note-panel')) slot.replaceChildren(notePanel(list, item));
    editing.item = item;
    syncNote(item);
    return;
  }
  if (editing.kind === 'tag') {
    if (!$('tag-form')) {
      slot.replaceChildren(editForm('tag', `New tag for ${item.name}`, '', 'tag-' + item.id, (tag) => {
        const now = currentList(list.id);
        const current = now && items(now).find((i) => i.id === item.id);
        if (current) { changeTags(now, current, [tag], []); announce(`Tagged ${current.name} ${tag}.`); }
      }, { save: `Save the tag for ${item.name}`, cancel: 'Cancel the tag' }));
    }
    return;
  }
  if (!$('edit-form')) {
    slot.replaceChildren(editForm('edit', `Text of ${item.name}`, editing.base, 'edit-' + item.id, (text) => saveText(list.id, text),
                                  { save: `Save the text of ${item.name}`, cancel: 'Cancel editing' }));
    restoreDraft(item.id);
  }
  editing.item = item;
  if (editing.removed) { // it is back (someone restored it): the form edits it again
    editing.removed = false;
    $('edit-note').hidden = true;
    const save = $('edit-save'), cancel = $('edit-cancel');
    save.textContent = 'Save';
    save.setAttribute('aria-label', `Save the text of ${item.name}`);
    cancel.textContent = 'Cancel';
    cancel.setAttribute('aria-label', 'Cancel editing');
  }
  showStale(item);
}

/**
 * An item's note, open under its row: a text box whose every input is saved at once as an edit of the note
 * (notes have no Save), with Done (or Escape) to close it.
 */
function notePanel(list, item) {
  const input = el('textarea', { id: 'note-input', class: 'note-input', rows: 6, dir: 'auto', spellcheck: 'true',
                                 'aria-describedby': 'note-help' });
  input.value = item.note; // the text, or a plain string someone wrote (noteState)
  const close = () => {
    state.editing = null;
    state.focusAfter = 'note-' + item.id;
    render();
  };
  input.addEventListener('input', () => noteInput(list.id, item.id, input));
  input.addEventListener('compositionstart', () => { if (state.editing) state.editing.composing = true; });
  input.addEventListener('compositionend', () => {
    if (!state.editing || state.editing.kind !== 'note') return;
    state.editing.composing = false;
    noteInput(list.id, item.id, input);
    const now = itemNow(list, item.id);
    if (now) syncNote(now);
  });
  input.addEventListener('keydown', (event) => { if (event.key === 'Escape') close(); });
  return el('div', { class: 'note-panel', id: 'note-panel' },
    el('label', { for: 'note-input', text: `Note of ${item.name}` }), input,
    el('p', { class: 'help', id: 'note-help', text: 'Saved as you type. Others can edit it at the same time: both edits stay.' }),
    el('button', { type: 'button', class: 'button small', id: 'note-done', 'aria-label': `Close the note of ${item.name}`, onclick: close }, 'Done'));
}

/**
 * Someone else changed the item under an open edit field: an untouched field takes their text (the
 * caret where it was); a field the person typed in keeps their text and says what changed, and Save
 * then asks before replacing their text.
 */
function showStale(item) {
  const editing = state.editing;
  const input = $('edit-input');
  if (!editing || !input) return;
  if (item.text !== editing.base) {
    if (input.value === editing.base) {
      const { selectionStart, selectionEnd } = input;
      input.value = item.text;
      if (document.activeElement === input) input.setSelectionRange(Math.min(selectionStart, item.text.length), Math.min(selectionEnd, item.text.length));
      editing.base = item.text;
      editing.stale = false;
      setStaleText(`${changer(item)} changed this to “${item.text}”; the field shows it.`, false);
      return;
    }
    editing.stale = true;
    editing.theirs = item.text;
    setStaleText(`${changer(item)} changed this to “${item.text}” while you were editing. Save asks before replacing it.`, true);
  }
}

/** Who changed an item last, as the start of a sentence. */
function changer(item) {
  const modified = item.record && item.record.modified;
  const who = modified ? personName(modified.userRecordName) : 'Someone';
  return who === 'you' ? 'You (elsewhere)' : who;
}

function setStaleText(text, offerTheirs) {
  const note = $('edit-note');
  if (!note) return;
  note.hidden = false;
  note.querySelector('.note-text').textContent = text;
  $('edit-theirs').hidden = !offerTheirs;
}

/** The field's Save: a stale field asks once ("Replace their text"), a removed item is made again. */
function saveText(listID, text) {
  const editing = state.editing;
  if (!editing) return true;
  const list = currentList(listID);
  if (editing.removed) {
    if (list) {
      const previous = editing.item;
      restoreItems(list, [{ ...previous, text, generation: (previous.record.crdt.generation || 1) + 1 }]);
      announce(`Restored ${text}.`);
    }
    forgetDraft();
    return true;
  }
  const item = list && items(list).find((i) => i.id === editing.id);
  if (!item) return true;
  if (editing.stale && !editing.confirm && text !== item.text) {
    editing.confirm = true;
    setStaleText(`${changer(item)} changed this to “${item.text}”. Press Replace their text to save yours instead, or Use their text.`, true);
    const save = $('edit-save');
    save.textContent = 'Replace their text';
    save.setAttribute('aria-label', `Replace “${item.text}” with your text`);
    return false; // the form stays open
  }
  if (text !== item.text) setText(list, item, text);
  forgetDraft();
  return true;
}

/** The row of an item removed while being edited: the text stays, with Restore and Discard. */
function markRemoved(list, row) {
  const editing = state.editing;
  row.hidden = false;
  row.classList.add('removed');
  if (editing.removed) return;
  editing.removed = true;
  const item = editing.item;
  setStaleText(`${removerName(list, item.id)} removed this item. Your text is kept: Restore brings the item back with it.`, false);
  const save = $('edit-save');
  if (save) { save.textContent = 'Restore'; save.setAttribute('aria-label', `Restore ${item.name} with your text`); }
  const cancel = $('edit-cancel');
  if (cancel) { cancel.textContent = 'Discard'; cancel.setAttribute('aria-label', `Discard your text for ${item.name}`); }
  announce(`${removerName(list, item.id)} removed ${item.name} while you were editing it. Your text is kept.`);
}

function removerName(list, id) {
  const record = state.replica.record(list.zone.key, id);
  const who = record && record.modified ? personName(record.modified.userRecordName) : 'Someone';
  return who === 'you' ? 'You (elsewhere)' : who;
}

// Drafts: what is typed in the edit field and the quick-add field is kept in this browser as it is
// typed, so a reload, a crash or an outage never loses it.
const DRAFT_KEY = 'lattice.drafts';
function drafts() { try { return JSON.parse(localStorage.getItem(DRAFT_KEY) || '{}'); } catch (_) { return {}; } }
function setDraft(key, value) {
  const all = drafts();
  if (value) all[key] = value; else delete all[key];
  localStorage.setItem(DRAFT_KEY, JSON.stringify(all));
}
function restoreDraft(itemID) {
  const draft = drafts()['edit:' + itemID];
  const input = $('edit-input');
  if (draft && input && draft !== input.value) input.value = draft;
}
/** After a reload: an edit field that held unsaved text opens again with it. */
function reopenDraft() {
  const list = currentList();
  if (!list || state.editing) return;
  for (const key of Object.keys(drafts())) {
    if (!key.startsWith('edit:')) continue;
    const item = items(list).find((i) => i.id === key.slice(5));
    if (item) { state.editing = { kind: 'text', id: item.id, base: item.text, item, stale: false, confirm: false, removed: false }; return; }
  }
}
function forgetDraft() { if (state.editing) setDraft('edit:' + state.editing.id, null); }

/** An inline form with one text field; Escape or Cancel closes it, and the focus goes back to `opener`. */
function editForm(name, label, value, opener, save, names) {
  const input = el('input', { id: name + '-input', maxlength: 1000, dir: 'auto', autocomplete: 'off' });
  input.value = value;
  const close = () => {
    if (name === 'edit') forgetDraft();
    state.editing = null;
    state.focusAfter = opener;
    render();
  };
  input.addEventListener('keydown', (event) => { if (event.key === 'Escape') close(); });
  if (name === 'edit') input.addEventListener('input', () => { if (state.editing) setDraft('edit:' + state.editing.id, input.value); });
  const form = el('form', { class: 'inline edit-form', id: name + '-form', onsubmit: (event) => {
    event.preventDefault();
    const text = input.value.trim();
    if (!text) { close(); return; }
    if (save(text) === false) return;
    state.editing = null;
    state.focusAfter = opener;
    render();
  } }, el('label', { for: name + '-input', text: label }), input);
  if (name === 'edit') {
    form.append(el('p', { class: 'edit-note', id: 'edit-note', role: 'status', hidden: true },
      el('span', { class: 'note-text' }), ' ',
      el('button', { type: 'button', class: 'button small secondary', id: 'edit-theirs', hidden: true, onclick: () => {
        const editing = state.editing;
        if (!editing || editing.theirs === undefined) return;
        input.value = editing.theirs;
        editing.base = editing.theirs;
        editing.stale = false;
        editing.confirm = false;
        setDraft('edit:' + editing.id, null);
        $('edit-note').hidden = true;
        const saveButton = $('edit-save');
        saveButton.textContent = 'Save';
        saveButton.setAttribute('aria-label', names.save);
        input.focus();
      } }, 'Use their text')));
  }
  form.append(el('button', { type: 'submit', class: 'button small', id: name + '-save', 'aria-label': names.save }, 'Save'),
              el('button', { type: 'button', class: 'button small secondary', id: name + '-cancel', 'aria-label': names.cancel, onclick: close }, 'Cancel'));
  return form;
}

/** A button that asks again in place (no dialog) before it acts. */
function confirmButton(id, label, question, action) {
  const button = el('button', { type: 'button', class: 'button danger', id }, label);
  button.addEventListener('click', () => {
    if (button.dataset.armed === 'true') { state.focusAfter = 'new-list-title'; action(); return; }
    button.dataset.armed = 'true';
    button.textContent = question + '? Press again';
    setTimeout(() => { if (button.isConnected) { button.dataset.armed = ''; button.textContent = label; } }, 5000);
  });
  return button;
}

function renderAddForm(list) {
  const key = 'add:' + list.id;
  const text = el('input', { id: 'new-item', required: true, maxlength: 1000, placeholder: 'Add an item', dir: 'auto', autocomplete: 'off' });
  text.value = drafts()[key] || '';
  text.addEventListener('input', () => setDraft(key, text.value));
  const tags = el('input', { id: 'new-item-tags', placeholder: 'tags, comma separated', dir: 'auto', autocomplete: 'off' });
  return el('form', { id: 'add-item', class: 'quick-add', onsubmit: (event) => {
    event.preventDefault();
    const value = text.value.trim();
    if (!value) return;
    const tagList = [...new Set(tags.value.split(',').map((t) => t.trim()).filter(Boolean))];
    text.value = '';
    tags.value = '';
    setDraft(key, null);
    const now = currentList(list.id);
    if (now) addItem(now, value, tagList);
    text.focus();
  } },
  el('label', { for: 'new-item', class: 'visually-hidden', text: 'Add an item' }), text,
  el('label', { for: 'new-item-tags', class: 'visually-hidden', text: 'Tags for the new item' }), tags,
  el('button', { type: 'submit', class: 'button', id: 'add-item-button', 'aria-label': 'Add the item' }, 'Add'));
}

// MARK: Sharing

function shareBody(list, extra = {}) {
  const body = { zoneID: list.zone.zoneID, ...extra };
  if (list.share) body.shareRecordName = list.share.recordName;
  return body;
}

/** The list's share, made (invited people only) when it has none yet. */
async function ensureShare(list, permission) {
  if (list.share) return list;
  const share = await state.api.call('private', 'shares/create', {
    zoneID: list.zone.zoneID, rootRecordName: list.id, title: list.title, publicPermission: permission });
  await state.replica.sync();
  const again = currentList(list.id) || list;
  if (!again.share) again.share = { recordName: share.shareRecordName };
  return again;
}

async function makeLink(list, permission, expires, singleUse) {
  const current = await ensureShare(list, permission);
  const share = await state.api.call(current.zone.database, 'shares/lookup', shareBody(current));
  // A share with invited people stays invited-only (public and invited users do not mix): its links then
  // work for the invited only. A share with nobody else becomes public at the link's permission.
  const invited = (share.participants || []).some((p) => p.role !== 'owner' && p.role !== 'publicUser' && p.acceptanceStatus !== 'removed');
  if (share.publicPermission === 'none' && !invited) {
    await state.api.call(current.zone.database, 'shares/modify', shareBody(current, { publicPermission: permission }));
  }
  const body = shareBody(current, { permission });
  if (expires) body.expiresInSeconds = expires;
  if (singleUse) body.maxUses = 1;
  return state.api.call(current.zone.database, 'shares/url', body);
}

async function shareModify(list, extra) {
  const current = await ensureShare(list, 'none');
  return state.api.call(current.zone.database, 'shares/modify', shareBody(current, extra));
}

/** The share panel (view 'share'): built once when it opens, updated in place. */
function renderShare(list) {
  const slot = $('share-slot');
  const button = $('share-button');
  const open = state.view === 'share';
  if (button) button.setAttribute('aria-expanded', String(open));
  if (!open) { if (slot.firstChild) slot.replaceChildren(); return; }
  if (!state.share || state.share.listID !== list.id) state.share = { listID: list.id, roster: null, link: null, consent: null };
  if (!$('share-panel')) {
    slot.replaceChildren(list.access === 'owner' ? ownerPanel(list) : memberPanel(list));
    loadRoster(list);
  }
}

function ownerPanel(list) {
  const panel = el('section', { class: 'share-panel', id: 'share-panel', 'aria-labelledby': 'share-heading' },
    el('h2', { id: 'share-heading', dir: 'auto', text: `Share “${list.title}”` }));
  if (state.replica.online === false) panel.append(el('p', { class: 'help', id: 'share-offline', text: 'Sharing needs a connection; you are offline.' }));

  // Who can join: anyone with the link, or only invited people (with consent before links stop).
  const modes = el('p', { class: 'inline modes' }, el('label', { for: 'share-mode', text: 'Who can join' }),
    el('select', { id: 'share-mode' }, el('option', { value: 'link', text: 'Anyone with the link' }),
       el('option', { value: 'invite', text: 'Only people I invite' })));
  modes.addEventListener('change', (event) => switchMode(list, event.target.value));
  panel.append(modes, el('div', { id: 'consent', class: 'consent', role: 'group', 'aria-labelledby': 'consent-text', hidden: true },
    el('p', { id: 'consent-text' }),
    el('button', { type: 'button', class: 'button small', id: 'consent-yes' }, 'Yes'),
    el('button', { type: 'button', class: 'button small secondary', id: 'consent-no' }, 'No')));

  const permission = el('select', { id: 'link-permission' },
    el('option', { value: 'readOnly', text: 'can view' }), el('option', { value: 'readWrite', text: 'can edit' }));
  const expiry = el('select', { id: 'link-expiry' },
    el('option', { value: '', text: 'never expires' }), el('option', { value: '3600', text: 'expires in 1 hour' }),
    el('option', { value: '86400', text: 'expires in 1 day' }), el('option', { value: '604800', text: 'expires in 7 days' }));
  const single = el('input', { type: 'checkbox', id: 'link-single' });
  const output = el('input', { id: 'link-url', readonly: true, 'aria-label': 'Share link' });
  const copy = el('button', { type: 'button', class: 'button secondary', id: 'copy-link', disabled: true,
                              onclick: () => copyLink(output) }, 'Copy');
  panel.append(el('form', { class: 'inline', id: 'link-form', onsubmit: async (event) => {
    event.preventDefault();
    try {
      const reply = await makeLink(currentList(list.id) || list, permission.value, Number(expiry.value) || 0, single.checked);
      output.value = reply.shortURL || reply.url;
      copy.disabled = false;
      announce('Link made.');
      await loadRoster(list);
    } catch (error) { notice('No link: ' + reasonOf(error), true); }
  } },
  el('label', { for: 'link-permission', text: 'A new link lets people' }), permission,
  el('label', { for: 'link-expiry', class: 'visually-hidden', text: 'Expiry' }), expiry,
  el('span', { class: 'check' }, single, el('label', { for: 'link-single', text: 'single use' })),
  el('button', { type: 'submit', class: 'button', id: 'make-link', text: 'Make link' })));
  panel.append(el('p', { class: 'inline link-row' }, output, copy),
    el('p', { class: 'help', id: 'link-help', hidden: true }),
    el('p', { class: 'inline' }, confirmButton('revoke-links', 'Turn off links', 'Every link made so far stops working', async () => {
      try {
        const current = currentList(list.id) || list;
        if (!current.share) return;
        await state.api.call('private', 'shares/url', shareBody(current, { rotate: true }));
        output.value = '';
        copy.disabled = true;
        notice('The links made so far no longer work. People who joined keep their access.');
      } catch (error) { notice('Not turned off: ' + reasonOf(error), true); }
    })));

  const name = el('input', { id: 'invite-name', required: true, maxlength: 64, autocomplete: 'off', dir: 'auto' });
  const invitePermission = el('select', { id: 'invite-permission' },
    el('option', { value: 'readOnly', text: 'can view' }), el('option', { value: 'readWrite', text: 'can edit' }));
  panel.append(el('form', { class: 'inline', id: 'invite-form', onsubmit: async (event) => {
    event.preventDefault();
    const who = name.value.trim();
    if (!who) return;
    const roster = state.share && state.share.roster;
    const invite = async (extra = {}) => {
      try {
        await shareModify(currentList(list.id) || list, { ...extra, participants: [{ operation: 'invite', userName: who, permission: invitePermission.value }] });
        notice(`Invited ${who}. They see the invitation on their lists page.`);
        name.value = '';
        await loadRoster(list);
      } catch (error) { notice('Not invited: ' + reasonOf(error), true); }
    };
    if (roster && roster.publicPermission && roster.publicPermission !== 'none') {
      const joined = (roster.participants || []).filter((p) => p.role === 'publicUser' && p.acceptanceStatus === 'accepted').length;
      ask(`Inviting ${who} makes this list invite-only: its links stop letting new people in` +
          (joined ? `, and ${joined} ${joined === 1 ? 'person' : 'people'} who joined by link lose access` : '') + '. Go ahead?',
          `Make invite-only and invite ${who}`, 'Keep the link', () => invite({ publicPermission: 'none' }));
      return;
    }
    invite();
  } }, el('label', { for: 'invite-name', text: 'Invite by user name' }), name,
  el('label', { for: 'invite-permission', class: 'visually-hidden', text: 'Permission for the invited person' }), invitePermission,
  el('button', { type: 'submit', class: 'button', id: 'invite-button', text: 'Invite' })));

  panel.append(el('h3', { id: 'people-heading', text: 'People' }), el('ul', { id: 'participants', class: 'participants', 'aria-labelledby': 'people-heading' }),
    el('p', { class: 'inline' }, confirmButton('stop-sharing', 'Stop sharing', 'Everyone else loses access', async () => {
      try {
        const current = currentList(list.id) || list;
        if (!current.share) { notice('This list is not shared.'); return; }
        await state.api.call('private', 'shares/delete', shareBody(current));
        output.value = '';
        copy.disabled = true;
        notice(`“${list.title}” is no longer shared.`);
        await state.replica.sync();
        await loadRoster(list);
      } catch (error) { notice('Still shared: ' + reasonOf(error), true); }
    })));
  return panel;
}

/** Asks in place (no dialog): `yes` runs on the first button; either answer closes the question. */
function ask(question, yesLabel, noLabel, yes, no = () => {}) {
  const box = $('consent');
  if (!box) return;
  $('consent-text').textContent = question;
  const yesButton = $('consent-yes'), noButton = $('consent-no');
  yesButton.textContent = yesLabel;
  noButton.textContent = noLabel;
  const close = () => { box.hidden = true; };
  yesButton.onclick = () => { close(); yes(); };
  noButton.onclick = () => { close(); no(); };
  box.hidden = false;
  yesButton.focus();
}

async function switchMode(list, mode) {
  const roster = state.share && state.share.roster;
  const current = roster && roster.publicPermission && roster.publicPermission !== 'none' ? 'link' : 'invite';
  if (mode === current) return;
  if (mode === 'invite') {
    const joined = roster ? (roster.participants || []).filter((p) => p.role === 'publicUser' && p.acceptanceStatus === 'accepted').length : 0;
    ask(`Only invited people can join then: the links stop letting anyone in` +
        (joined ? `, and ${joined} ${joined === 1 ? 'person' : 'people'} who joined by link lose access` : '') + '. Go ahead?',
        'Make it invite-only', 'Keep the link', async () => {
          try { await shareModify(currentList(list.id) || list, { publicPermission: 'none' }); notice('Only people you invite can join now.'); }
          catch (error) { notice('Not changed: ' + reasonOf(error), true); }
          await loadRoster(list);
        }, () => showMode(roster));
    return;
  }
  try {
    await shareModify(currentList(list.id) || list, { publicPermission: $('link-permission').value });
    notice('Anyone with a link can join now. Make a link to send.');
  } catch (error) { notice('Not changed: ' + reasonOf(error), true); }
  await loadRoster(list);
}

function showMode(roster) {
  const mode = $('share-mode');
  if (!mode) return;
  const isLink = !!(roster && roster.publicPermission && roster.publicPermission !== 'none');
  mode.value = isLink ? 'link' : 'invite';
  const help = $('link-help');
  if (help) {
    const invited = roster && (roster.participants || []).some((p) => p.role === 'privateUser' && p.acceptanceStatus !== 'removed');
    help.hidden = isLink || !invited;
    help.textContent = 'This list is invite-only: its links work only for the people you invited.';
  }
}

function memberPanel(list) {
  return el('section', { class: 'share-panel', id: 'share-panel', 'aria-labelledby': 'share-heading' },
    el('h2', { id: 'share-heading', dir: 'auto', text: `People on “${list.title}”` }),
    el('ul', { id: 'participants', class: 'participants', 'aria-labelledby': 'share-heading' }));
}

/** The share's roster (shares/lookup), for the owner's panel and a participant's list of people. */
async function loadRoster(given) {
  const list = currentList(given.id) || given;
  let roster = { participants: [] };
  if (list.share || list.access !== 'owner') {
    try {
      roster = await state.api.call(list.zone.database, 'shares/lookup', shareBody(list));
      if (state.replica.learnNames(roster.participants || [])) render();
    } catch (error) {
      roster = { participants: [], error: isUnreachable(error) ? 'offline' : reasonOf(error) };
    }
  }
  if (!state.share || state.share.listID !== list.id) return;
  state.share.roster = roster;
  showMode(roster);
  const people = $('participants');
  if (!people) return;
  if (roster.error === 'offline') {
    people.replaceChildren(el('li', { class: 'help', text: 'Offline: the people on this list show when you are back online.' }));
    return;
  }
  people.replaceChildren(...(roster.participants || []).filter((p) => p.acceptanceStatus !== 'removed' || list.access === 'owner')
    .map((p) => renderParticipant(list, p)));
}

function renderParticipant(list, p) {
  const row = el('li', { 'data-participant': p.name },
    el('span', { class: 'name', dir: 'auto', text: p.name + (p.userRecordName === state.session.userRecordName ? ' (you)' : '') }),
    el('span', { class: 'meta', text: ` ${roleWords[p.role] || p.role} · ${permissionWords[p.permission] || p.permission} · ${p.acceptanceStatus}` }));
  if (list.access === 'owner' && p.role !== 'owner') {
    const select = el('select', { id: 'participant-permission-' + p.name, 'aria-label': `Permission of ${p.name}`, onchange: async (event) => {
      try { await shareModify(currentList(list.id) || list, { participants: [{ operation: 'setPermission', userName: p.name, permission: event.target.value }] }); }
      catch (error) { notice('Not changed: ' + reasonOf(error), true); }
      await loadRoster(list);
    } }, el('option', { value: 'readOnly', text: 'can view', selected: p.permission === 'readOnly' }),
    el('option', { value: 'readWrite', text: 'can edit', selected: p.permission === 'readWrite' }));
    row.append(select, el('button', { type: 'button', class: 'button small danger', id: 'participant-remove-' + p.name,
                                      'aria-label': `Remove ${p.name} from the list`, onclick: async () => {
      try { await shareModify(currentList(list.id) || list, { participants: [{ operation: 'remove', userName: p.name }] }); await loadRoster(list); }
      catch (error) { notice('Not removed: ' + reasonOf(error), true); }
    } }, 'Remove'));
  }
  return row;
}

/**
 * Copies the link: the asynchronous clipboard (a secure context: https, or http on 127.0.0.1 or
 * localhost), else the selection and the older copy command (plain http on another address, or a
 * browser that refused the clipboard). Says which happened.
 */
async function copyLink(output) {
  if (!output.value) return;
  try {
    if (!navigator.clipboard) throw new Error('no asynchronous clipboard here');
    await navigator.clipboard.writeText(output.value);
    notice('Link copied.');
    return;
  } catch (_) { /* the older way below */ }
  output.focus();
  output.select();
  let copied = false;
  try { copied = document.execCommand('copy'); } catch (_) { copied = false; }
  if (copied) { const button = $('copy-link'); if (button) button.focus(); } // else the selected link keeps the focus
  notice(copied ? 'Link copied.' : 'The link is selected: copy it with Ctrl+C (⌘C on a Mac).');
}

async function leave(list) {
  try {
    await state.api.call('shared', 'shares/leave', shareBody(list));
    state.deletedHere.set(list.id, 'Left');
    await state.replica.sync();
  } catch (error) { notice((isUnreachable(error) ? 'Leaving needs a connection: ' : 'Not left: ') + reasonOf(error), true); }
}

// MARK: Invitations

/** Shows the pending invitations (shares/invitations) with Accept and Decline; an older server shows none. */
async function loadInvitations() {
  let invitations = [];
  try {
    invitations = (await state.api.call('shared', 'shares/invitations', {})).invitations || [];
  } catch (_) {
    return; // offline, or a server without invitations: nothing to show
  }
  const list = $('invitation-list');
  list.replaceChildren(...invitations.map((invitation, index) => {
    const what = `“${invitation.title || 'A list'}” from ${invitation.ownerName}`;
    const access = invitation.permission === 'readWrite' ? 'can edit' : 'can view';
    const text = el('span', { dir: 'auto', text: `${what} (${access})` });
    const accept = el('button', { type: 'button', class: 'button small', id: `invitation-accept-${index}`, text: 'Accept',
      'aria-label': `Accept ${what}`, onclick: async () => {
        try {
          const reply = await state.api.call('shared', 'records/accept', { shortGUIDs: [{ value: invitation.url }] });
          const result = (reply.results || [])[0] || {};
          if (result.serverErrorCode) throw new ApiError(result.serverErrorCode, result.reason, 200);
          notice(`Joined ${what}.`);
          await state.replica.sync();
          await loadInvitations();
        } catch (error) { notice('Not joined: ' + reasonOf(error), true); }
      } });
    const decline = el('button', { type: 'button', class: 'button small secondary', id: `invitation-decline-${index}`, text: 'Decline',
      'aria-label': `Decline ${what}`, onclick: async () => {
        try {
          try {
            await state.api.call('shared', 'shares/decline', { zoneID: invitation.zoneID, shareRecordName: invitation.shareRecordName });
          } catch (error) {
            if (!(error instanceof ApiError) || error.status !== 404 || error.code === 'NOT_FOUND') throw error;
            // A server without shares/decline: leaving declines a pending invitation.
            await state.api.call('shared', 'shares/leave', { zoneID: invitation.zoneID, shareRecordName: invitation.shareRecordName });
          }
          notice(`Declined ${what}.`);
          await loadInvitations();
        } catch (error) { notice('Not declined: ' + reasonOf(error), true); }
      } });
    return el('li', { class: 'invitation' }, text, accept, decline);
  }));
  $('invitations').hidden = invitations.length === 0;
}

// MARK: Connection and replica events

function showStatus(status) {
  const box = $('connection');
  const waiting = status.pending === 1 ? '1 change waits' : `${status.pending} changes wait`;
  let text = '';
  if (status.signedOut) text = status.pending ? `Signed out: ${waiting} to be sent; sign in again to send them.` : 'Signed out: sign in again.';
  else if (status.online === false) text = status.pending ? `Offline. ${waiting} to be sent; they are kept on this device.` : 'Offline. You can keep editing; changes are kept on this device.';
  else if (status.pending) text = status.pending === 1 ? 'Sending 1 change…' : `Sending ${status.pending} changes…`;
  box.hidden = !text;
  box.classList.toggle('offline', status.online === false || status.signedOut);
  const textNode = $('connection-text');
  if (textNode.textContent !== text) textNode.textContent = text;
  $('connection-signin').hidden = !status.signedOut;
  document.body.dataset.online = String(status.online !== false);
  document.body.dataset.pending = String(status.pending);
  if (state.share && $('share-offline')) $('share-offline').hidden = status.online !== false;
  if (status.online !== false && state.photoRetry.size) { // thumbnails that failed offline load again
    for (const id of state.photoRetry) { const known = state.rows.get(id); if (known) known.signature = null; }
    state.photoRetry.clear();
    render();
  }
  // "not sent yet" / "saving…" under each waiting item
  if (showStatus.last !== `${status.online}|${status.pending}`) { showStatus.last = `${status.online}|${status.pending}`; render(); }
}

/** Says what others changed in the open list, an item at a time (a few at most). */
function announceRemote(changes) {
  const list = currentList();
  if (!list) return;
  const messages = [];
  for (const change of changes) {
    if (!change.remote || change.key !== list.zone.key) continue;
    const before = change.before && !change.before.deleted && change.before.recordType === 'Item' ? itemOf(change.before) : null;
    const after = change.after && !change.after.deleted && change.after.recordType === 'Item' ? itemOf(change.after) : null;
    const record = change.after || change.before;
    if (!record || record.recordType !== 'Item' || (record.parent && record.parent.recordName !== list.id && before === null)) continue;
    const who = change.after && change.after.modified ? personName(change.after.modified.userRecordName) : 'Someone';
    const name = who === 'you' ? 'You (elsewhere)' : who;
    if (!before && after) messages.push(`${name} added ${after.text}.`);
    else if (before && !after) messages.push(`${name} removed ${before.text}.`);
    else if (before && after) {
      if (before.text !== after.text) messages.push(`${name} changed ${before.text} to ${after.text}.`);
      if (before.done !== after.done) messages.push(`${name} ${after.done ? 'checked' : 'unchecked'} ${after.text}.`);
      const added = after.tags.filter((t) => !before.tags.includes(t)), removed = before.tags.filter((t) => !after.tags.includes(t));
      if (added.length) messages.push(`${name} tagged ${after.text} ${added.join(', ')}.`);
      if (removed.length) messages.push(`${name} removed tag ${removed.join(', ')} from ${after.text}.`);
      if (before.note !== after.note) messages.push(`${name} edited the note of ${after.text}.`);
      const photo = (i) => (i.photo ? i.photo.fileChecksum : null);
      if (photo(before) !== photo(after)) messages.push(after.photo ? `${name} added a photo to ${after.text}.` : `${name} removed the photo of ${after.text}.`);
    }
  }
  if (!messages.length) return;
  announce(messages.length <= 3 ? messages.join(' ') : `${messages.length} changes in ${list.title}.`);
}

const listener = {
  changed(changes) {
    announceRemote(changes);
    render();
    // Someone joined, left or was changed on the open share panel's list: its people again.
    const list = currentList();
    if (state.view === 'share' && list && changes.some((c) => c.key === list.zone.key
        && ((c.after || c.before || {}).recordType === 'cloudkit.share'))) loadRoster(list);
    // A list the address asked for that this browser did not know yet (just joined, say) opens once it arrives.
    if (state.wantedList && state.wantedList !== state.openList && lists().some((l) => l.id === state.wantedList)) {
      const id = state.wantedList;
      state.wantedList = null;
      go('list', id);
    }
  },
  status(status) { showStatus(status); },
  refused(entry, reason) {
    notice(entry.kind === 'photo' ? `The photo of “${entry.itemText}” was not saved: ${reason}` : 'Not saved: ' + reason, true);
    render();
  },
  lost(entry, record, shown) {
    const list = lists().find((l) => l.zone.key === entry.zone);
    const edit = (entry.states || []).find((s) => s.recordName === record.recordName);
    const item = shown ? itemOf(shown) : edit && fieldValue(edit, 'text') !== undefined ? itemOf(edit) : null;
    if (!list || !item || record.recordType !== 'Item') return;
    notice(`“${item.text}” was removed by someone else before your change arrived: Undo brings it back with your change.`);
    offerUndo(`“${item.text}” was removed by someone else.`, `Bring back ${item.text}`,
              () => restoreItems(list, [{ ...item, generation: (record.crdt.generation || 1) + 1 }]));
  },
  zoneGone(zone, dropped) {
    if (dropped.length) notice(`${dropped.length} unsent ${dropped.length === 1 ? 'change' : 'changes'} could not be sent: the list is gone or no longer shared with you.`, true);
    render();
  },
};

// MARK: Start

async function signOut() {
  try { await state.api.signOut(); } catch (error) {
    if (isUnreachable(error)) { notice('Signing out needs a connection: try again when you are online.', true); return; }
  }
  if (state.replica && state.replica.store) state.replica.store.close();
  await Store.remove(state.session.userRecordName);
  forgetSession();
  localStorage.removeItem(DRAFT_KEY);
  location.replace('/');
}

function registerServiceWorker() {
  if (!('serviceWorker' in navigator)) return;
  navigator.serviceWorker.register('/web/sw.js', { scope: '/' }).catch(() => { /* the page works without */ });
  navigator.serviceWorker.ready.then(() => { document.body.dataset.offlineReady = 'true'; });
}

async function start() {
  const secret = hashValue('signin');
  if (secret) { // a sign-in link opened while signed in: another account's link asks the person first
    history.replaceState(null, '', '/');
    try { if (await followSignInLink(secret, document.body)) announceSignIn(); } catch (error) { notice(error.reason, true); }
  }
  // A share page to go back to: this address's `#next`, or one remembered when sign-in began (only ever
  // a relative /share/ path: safeNext).
  const next = safeNext(hashValue('next')) || takeNext();
  if (next) { location.replace(next); return; }
  let session;
  try {
    session = await currentSession();
  } catch (_) {
    session = undefined; // offline: open with the last account and what this browser kept
  }
  if (session === null) { location.replace('/'); return; }
  if (session) rememberSession(session);
  else {
    const last = lastSession();
    if (!last) {
      $('connection-text').textContent = 'Offline, and this browser keeps no lists yet: sign in when you are back online.';
      $('connection').hidden = false;
      document.body.dataset.ready = 'true';
      return;
    }
    session = { ...last, csrfToken: null };
  }
  state.session = session;
  state.api = new Api(session);
  state.replica = new Replica(state.api, listener);
  $('who').textContent = session.name;
  wireStatic();

  const wanted = hashValue('list');
  const kept = await state.replica.load();
  if (!kept && state.session.csrfToken) {
    try { await state.replica.coldStart(wanted); } catch (error) { state.replica.failed(error); }
  }
  // The address names the view; a list opened from a link gets the lists under it, so Back stays here.
  fromAddress();
  if (wanted && state.openList !== wanted) {
    state.wantedList = wanted;
    setTimeout(() => { state.wantedList = null; }, 30000);
  }
  history.replaceState({ view: 'lists' }, '', '/');
  if (state.openList) {
    history.pushState({ view: state.view, id: state.openList, from: { view: 'lists', id: null } }, '', hashFor(state.view, state.openList));
  }
  reopenDraft();
  render();
  showStatus(state.replica.status());
  document.body.dataset.ready = 'true';
  // After the first screen: the worker's first install fetches the web files, which would compete with it.
  setTimeout(registerServiceWorker, 0);
  state.replica.run();
  // Invitations are not in the change feeds (the invitee has no access yet): asked now and every minute.
  loadInvitations();
  setInterval(loadInvitations, 60 * 1000);
  setInterval(() => { state.rows.forEach((known) => { known.signature = null; }); render(); }, 60 * 1000); // "5 min ago"
  const recovered = sessionStorage.getItem('lattice.recoveryNotice');
  if (recovered) { sessionStorage.removeItem('lattice.recoveryNotice'); notice(recovered); }
  // A session renews while used (GET /auth/session past half its life): ask every six hours while open.
  setInterval(() => { currentSession().catch(() => {}); }, 6 * 3600 * 1000);
}

function wireStatic() {
  const signout = $('signout');
  signout.addEventListener('click', () => {
    const pending = state.replica ? state.replica.outbox.length : 0;
    if (pending && signout.dataset.armed !== 'true') {
      signout.dataset.armed = 'true';
      signout.textContent = `${pending} unsent: sign out anyway?`;
      setTimeout(() => { signout.dataset.armed = ''; signout.textContent = 'Sign out'; }, 5000);
      return;
    }
    signOut();
  });
  $('skip-link').addEventListener('click', (event) => {
    event.preventDefault();
    if ($('new-item')) $('new-item').focus(); else focusStatic(currentList() ? $('main') : $('lists-view'));
  });
  $('new-list').addEventListener('submit', (event) => {
    event.preventDefault();
    const input = $('new-list-title');
    const title = input.value.trim();
    input.value = '';
    if (title) createList(title);
  });
  window.addEventListener('popstate', () => { fromAddress(); render(); });
  window.addEventListener('hashchange', async () => {
    const secret = hashValue('signin');
    if (secret) { // a sign-in link opened in this tab: another account's asks the person first
      history.replaceState(null, '', '/');
      try {
        if (await followSignInLink(secret, document.body)) { announceSignIn(); location.reload(); }
      } catch (error) { notice(error.reason, true); }
      return;
    }
    const id = hashValue('list');
    if (id && id !== state.openList && lists().some((l) => l.id === id)) go('list', id, { replace: true });
  });
  window.matchMedia('(min-width: 48rem)').addEventListener('change', () => render());
}

start().catch((error) => notice(reasonOf(error), true));
