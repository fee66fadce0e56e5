// The web client: the account's lists, kept current by changes/* feeds and a changes/wait long poll.
// Writes send plain values and list add/remove operations (records/modify); the server stamps them.
// Every piece of user text is put on screen with textContent, never as HTML.
import { Api, ApiError, currentSession, hashValue, safeNext, takeNext, announceSignIn } from './api.js';
import { followSignInLink } from './signinlink.js';

const LIST_ZONE = 'Lists';
const state = {
  api: null,
  session: null,
  /** database -> change token */
  tokens: { private: null, shared: null },
  /** zone key -> {database, zoneID, token, records: Map(name -> record)} */
  zones: new Map(),
  /** zone key -> owner name (shared zones) */
  owners: new Map(),
  /** list ids on screen, to notice the ones that go */
  shownLists: new Map(),
  openList: null,
  /** list id -> what this page did to it ("Deleted", "Left"), so its going is said as such */
  deletedHere: new Map(),
  sharePanel: null,
  /** whether the last fetch brought anything */
  changed: false,
  /** an open inline form: {kind: 'title' | 'text' | 'tag', id} */
  editing: null,
  /** the id of the control to focus after the next render (a closed form's opener, say) */
  focusAfter: null,
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
  for (const child of children) if (child) node.append(child);
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

// MARK: Records

const zoneKey = (database, zoneID) => `${database}|${zoneID.ownerRecordName || ''}|${zoneID.zoneName}`;
const field = (record, name) => record.fields && record.fields[name] ? record.fields[name].value : undefined;

function randomID(prefix) {
  const bytes = new Uint8Array(6);
  crypto.getRandomValues(bytes);
  return prefix + Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
}

function lists() {
  const result = [];
  for (const [key, zone] of state.zones) {
    const shares = [...zone.records.values()].filter((r) => r.recordType === 'cloudkit.share');
    for (const record of zone.records.values()) {
      if (record.recordType !== 'List') continue;
      const share = shares.find((s) => field(s, 'rootRecordName') === record.recordName)
        || shares.find((s) => s.recordName === 'cloudkit.zoneshare');
      let access = 'owner';
      if (zone.database === 'shared') access = (share && permissionOf(share, state.session.userRecordName)) || 'readOnly';
      result.push({
        id: record.recordName, key, zone, record, share, access,
        title: field(record, 'title') || '',
        owner: zone.database === 'private' ? state.session.name : (state.owners.get(key) || 'someone'),
      });
    }
  }
  return result.sort((a, b) => a.title.localeCompare(b.title) || a.id.localeCompare(b.id));
}

/** A participant's permission from the share record's entries "userRecordName role permission status". */
function permissionOf(share, user) {
  for (const entry of field(share, 'participants') || []) {
    const [name, role, permission, status] = String(entry).split(' ');
    if (name === user && status === 'accepted') return role === 'owner' ? 'owner' : permission;
  }
  return null;
}

function items(list) {
  return [...list.zone.records.values()]
    .filter((r) => r.recordType === 'Item' && r.parent && r.parent.recordName === list.id)
    .map((r) => ({ id: r.recordName, record: r, text: field(r, 'text') || '', done: Number(field(r, 'done') || 0) !== 0,
                   tags: field(r, 'tags') || [], position: Number(field(r, 'position') || 0) }))
    .sort((a, b) => a.position - b.position || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
}

// MARK: Feeds

async function fetchDatabase(database) {
  let more = true;
  while (more) {
    const reply = await state.api.call(database, 'changes/database', state.tokens[database] ? { syncToken: state.tokens[database] } : {});
    for (const entry of reply.zones || []) {
      const key = zoneKey(database, entry.zoneID);
      state.changed = true;
      if (entry.deleted) { state.zones.delete(key); continue; }
      if (!state.zones.has(key)) state.zones.set(key, { database, zoneID: entry.zoneID, token: null, records: new Map() });
      await fetchZone(state.zones.get(key));
    }
    state.tokens[database] = reply.syncToken;
    more = reply.moreComing === true;
  }
}

async function fetchZone(zone) {
  const key = zoneKey(zone.database, zone.zoneID);
  for (let page = 0; page < 1000; page += 1) {
    const request = { zoneID: zone.zoneID };
    if (zone.token) request.syncToken = zone.token;
    const reply = await state.api.call(zone.database, 'changes/zone', { zones: [request] });
    const answer = (reply.zones || [])[0] || {};
    if (answer.serverErrorCode) {
      if (answer.serverErrorCode === 'CHANGE_TOKEN_EXPIRED') { zone.token = null; zone.records.clear(); continue; }
      state.zones.delete(key); // ZONE_NOT_FOUND: no longer ours or shared with us
      return;
    }
    for (const record of answer.records || []) {
      state.changed = true;
      if (record.deleted) zone.records.delete(record.recordName);
      else zone.records.set(record.recordName, record);
    }
    zone.token = answer.syncToken;
    if (!answer.moreComing) break;
  }
  if (zone.database === 'shared' && !state.owners.has(key)) await lookUpOwner(zone, key);
}

/** The owner's name of a shared zone, from the participants of one of its shares. */
async function lookUpOwner(zone, key) {
  const shareRecord = [...zone.records.values()].find((r) => r.recordType === 'cloudkit.share');
  if (!shareRecord) return;
  try {
    const share = await state.api.call('shared', 'shares/lookup', { zoneID: zone.zoneID, shareRecordName: shareRecord.recordName });
    const owner = (share.participants || []).find((p) => p.role === 'owner');
    if (owner) state.owners.set(key, owner.name);
  } catch (_) { /* the name stays unknown ("someone") until the next change */ }
}

/** Fetches what changed; re-renders only when something did (so the page does not churn). */
async function refresh(always = false) {
  state.changed = false;
  await fetchDatabase('private');
  await fetchDatabase('shared');
  if (state.changed || always) render();
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
          await refresh(true);
          await loadInvitations();
        } catch (error) { notice('Not joined: ' + (error.reason || error.message), true); }
      } });
    const decline = el('button', { type: 'button', class: 'button small secondary', id: `invitation-decline-${index}`, text: 'Decline',
      'aria-label': `Decline ${what}`, onclick: async () => {
        try {
          await state.api.call('shared', 'shares/decline', { zoneID: invitation.zoneID, shareRecordName: invitation.shareRecordName });
          notice(`Declined ${what}.`);
          await loadInvitations();
        } catch (error) { notice('Not declined: ' + (error.reason || error.message), true); }
      } });
    return el('li', { class: 'invitation' }, text, accept, decline);
  }));
  $('invitations').hidden = invitations.length === 0;
}

async function watch() {
  for (;;) {
    try {
      const reply = await state.api.call('private', 'changes/wait', {
        databases: [{ database: 'private', syncToken: state.tokens.private }, { database: 'shared', syncToken: state.tokens.shared }],
        timeout: 25,
      });
      if (reply.changed) await refresh();
    } catch (error) {
      if (error instanceof ApiError && (error.status === 401 || error.status === 421)) { location.replace('/'); return; }
      if (error instanceof ApiError && error.code === 'CHANGE_TOKEN_EXPIRED') {
        state.tokens = { private: null, shared: null };
        state.zones.clear();
      }
      await new Promise((resolve) => setTimeout(resolve, 1000));
      try { await refresh(); } catch (_) { /* retried on the next turn */ }
    }
  }
}

// MARK: Writes

/** records/modify with an optimistic change: `apply` edits the local copies; a refusal puts them back. */
async function modify(list, operations, apply) {
  const saved = new Map();
  for (const op of operations) {
    const name = op.record.recordName;
    saved.set(name, list.zone.records.get(name));
  }
  apply();
  render();
  try {
    const reply = await state.api.call(list.zone.database, 'records/modify', { zoneID: list.zone.zoneID, operations });
    const failed = (reply.records || []).filter((r) => r.serverErrorCode);
    for (const record of reply.records || []) {
      if (record.serverErrorCode) continue;
      if (record.deleted) list.zone.records.delete(record.recordName);
      else if (!record.fieldsOmitted) list.zone.records.set(record.recordName, record);
    }
    if (failed.length) {
      for (const record of failed) restore(list, saved, record.recordName);
      notice('Not saved: ' + failed[0].reason, true);
    }
  } catch (error) {
    for (const name of saved.keys()) restore(list, saved, name);
    notice('Not saved: ' + (error.reason || error.message), true);
  }
  render();
}

function restore(list, saved, name) {
  const old = saved.get(name);
  if (old) list.zone.records.set(name, old); else list.zone.records.delete(name);
}

function localEdit(list, name, fields, extra = {}) {
  const old = list.zone.records.get(name) || { recordName: name, fields: {} };
  const copy = { ...old, ...extra, fields: { ...old.fields } };
  for (const [key, value] of Object.entries(fields)) copy.fields[key] = { ...(copy.fields[key] || {}), value };
  list.zone.records.set(name, copy);
}

const update = (name, fields) => ({ operationType: 'forceUpdate', record: { recordName: name, fields } });

function addItem(list, text, tags) {
  const id = randomID('i');
  const position = Math.max(0, ...items(list).map((i) => i.position)) + 1;
  const fields = { text: { value: text, type: 'STRING' }, done: { value: 0, type: 'INT64' },
                   position: { value: position, type: 'DOUBLE' } };
  if (tags.length) fields.tags = { add: tags, type: 'STRING_LIST' };
  const op = { operationType: 'create', record: { recordName: id, recordType: 'Item', fields, parent: { recordName: list.id } } };
  return modify(list, [op], () => localEdit(list, id, { text, done: 0, position, tags }, { recordType: 'Item', parent: { recordName: list.id } }));
}

function setDone(list, item, done) {
  return modify(list, [update(item.id, { done: { value: done ? 1 : 0, type: 'INT64' } })],
    () => localEdit(list, item.id, { done: done ? 1 : 0 }));
}

function setText(list, item, text) {
  return modify(list, [update(item.id, { text: { value: text, type: 'STRING' } })], () => localEdit(list, item.id, { text }));
}

function changeTags(list, item, add, remove) {
  const edit = { type: 'STRING_LIST' };
  if (add.length) edit.add = add;
  if (remove.length) edit.remove = remove;
  const next = [...new Set([...item.tags.filter((t) => !remove.includes(t)), ...add])];
  return modify(list, [update(item.id, { tags: edit })], () => localEdit(list, item.id, { tags: next }));
}

function removeItem(list, item) {
  return modify(list, [{ operationType: 'forceDelete', record: { recordName: item.id } }], () => list.zone.records.delete(item.id));
}

function rename(list, title) {
  return modify(list, [update(list.id, { title: { value: title, type: 'STRING' } })], () => localEdit(list, list.id, { title }));
}

function deleteList(list) {
  state.deletedHere.set(list.id, 'Deleted');
  const names = [...items(list).map((i) => i.id), list.id];
  return modify(list, names.map((name) => ({ operationType: 'forceDelete', record: { recordName: name } })),
    () => { for (const name of names) list.zone.records.delete(name); });
}

async function createList(title) {
  try {
    await state.api.call('private', 'zones/modify', { operations: [{ operationType: 'create', zone: { zoneID: { zoneName: LIST_ZONE } } }] });
    const id = randomID('l');
    const reply = await state.api.call('private', 'records/modify', { zoneID: { zoneName: LIST_ZONE }, operations: [
      { operationType: 'create', record: { recordName: id, recordType: 'List', fields: { title: { value: title, type: 'STRING' } } } }] });
    const result = (reply.records || [])[0] || {};
    if (result.serverErrorCode) throw new ApiError(result.serverErrorCode, result.reason, 200);
    await refresh();
    state.focusAfter = 'new-item'; // the next thing to do: add its first item
    open(id);
  } catch (error) {
    notice('Not created: ' + (error.reason || error.message), true);
  }
}

// MARK: Sharing

function shareBody(list, extra = {}) {
  const body = { zoneID: list.zone.zoneID, ...extra };
  if (list.share) body.shareRecordName = list.share.recordName;
  return body;
}

async function ensureShare(list, permission) {
  if (list.share) return;
  await state.api.call('private', 'shares/create', {
    zoneID: list.zone.zoneID, rootRecordName: list.id, title: list.title, publicPermission: permission });
  await refresh();
}

async function makeLink(list, permission, expires, singleUse) {
  await ensureShare(list, permission);
  const current = lists().find((l) => l.id === list.id) || list;
  const share = await state.api.call(current.zone.database, 'shares/lookup', shareBody(current));
  // A share with invited people stays invited-only (public and invited users do not mix): its links then
  // work for the invited only. A share with nobody else becomes public at the link's permission.
  const invited = (share.participants || []).some((p) => p.role !== 'owner' && p.acceptanceStatus !== 'removed');
  if (share.publicPermission === 'none' && !invited) {
    await state.api.call(current.zone.database, 'shares/modify', shareBody(current, { publicPermission: permission }));
  }
  const body = shareBody(current, { permission });
  if (expires) body.expiresInSeconds = expires;
  if (singleUse) body.maxUses = 1;
  return state.api.call(current.zone.database, 'shares/url', body);
}

async function shareModify(list, participants, extra = {}) {
  await ensureShare(list, 'none');
  const current = lists().find((l) => l.id === list.id) || list;
  return state.api.call(current.zone.database, 'shares/modify', shareBody(current, { participants, ...extra }));
}

// MARK: Rendering

const permissionWords = { owner: 'owner', readWrite: 'can edit', readOnly: 'can view' };
const roleWords = { owner: 'owner', administrator: 'administrator', privateUser: 'invited', publicUser: 'joined by link' };

/**
 * Re-renders from the records, keeping what the person is typing (inputs by id) and the focus: every
 * control has a stable id, so a keyboard user's place survives live updates; `state.focusAfter` moves
 * the focus on purpose (back to the button that opened a form that closed, say).
 */
function render() {
  const kept = new Map();
  for (const input of document.querySelectorAll('main input[id], main select[id]')) {
    kept.set(input.id, input.type === 'checkbox' ? { checked: input.checked } : input.value);
  }
  const focused = document.activeElement && document.activeElement.id;
  renderAll();
  for (const [id, value] of kept) {
    const input = document.getElementById(id);
    if (!input || input.readOnly) continue;
    if (typeof value === 'object') {
      if (!input.disabled && !id.startsWith('done-')) input.checked = value.checked; // item boxes show the record
    } else {
      input.value = value;
    }
  }
  const target = (state.focusAfter && document.getElementById(state.focusAfter)) || (focused && document.getElementById(focused));
  state.focusAfter = null;
  if (target && target !== document.activeElement) target.focus();
}

function renderAll() {
  const all = lists();
  // Lists that went away: deleted elsewhere, or our access to them removed.
  const now = new Map(all.map((l) => [l.id, l.title]));
  for (const [id, title] of state.shownLists) {
    if (now.has(id)) continue;
    // Gone by this page's own hand: deleted (own list) or left (a list shared with us), said as such.
    if (state.deletedHere.has(id)) { notice(`${state.deletedHere.get(id)} “${title}”.`); state.deletedHere.delete(id); }
    else notice(`“${title}” is no longer available: it was deleted, or you were removed from its share.`);
    if (state.openList === id) { state.openList = null; state.sharePanel = null; }
  }
  state.shownLists = now;

  const nav = $('lists');
  nav.replaceChildren(...all.map((list) => el('li', {},
    el('button', { type: 'button', id: 'list-' + list.id, class: 'list-link' + (list.id === state.openList ? ' current' : ''),
                   'aria-current': list.id === state.openList ? 'true' : false, 'data-list': list.id,
                   onclick: () => open(list.id) },
      el('span', { class: 'title', text: list.title || '(untitled)' }),
      el('span', { class: 'meta', text: `${list.owner} · ${permissionWords[list.access] || list.access}` })))));
  renderList(all.find((l) => l.id === state.openList));
}

function open(id) {
  state.openList = id;
  state.sharePanel = null;
  history.replaceState(null, '', '/#list=' + encodeURIComponent(id));
  render();
}

function renderList(list) {
  const main = $('list');
  if (!list) { main.replaceChildren(el('p', { class: 'help', id: 'empty', text: 'Choose a list, or create one.' })); return; }
  const canEdit = list.access === 'owner' || list.access === 'readWrite';
  const heading = el('div', { class: 'list-head' },
    el('h2', { id: 'list-title', text: list.title || '(untitled)' }),
    el('p', { class: 'meta', id: 'list-access', text: `${list.owner} · ${permissionWords[list.access] || list.access}` }));
  const tools = el('div', { class: 'tools' });
  if (canEdit) {
    tools.append(el('button', { type: 'button', class: 'button secondary', id: 'rename', onclick: () => {
      state.editing = { kind: 'title', id: list.id };
      render();
      $('rename-input').focus();
    } }, document.createTextNode('Rename')));
  }
  if (list.access === 'owner') {
    tools.append(el('button', { type: 'button', class: 'button secondary', id: 'share-button',
      onclick: () => { state.sharePanel = state.sharePanel ? null : {}; render(); } }, document.createTextNode('Share')));
    tools.append(confirmButton('delete-list', 'Delete list', `Delete “${list.title}” and its items`, () => deleteList(list)));
  } else {
    tools.append(confirmButton('leave', 'Leave', `Leave “${list.title}”`, () => leave(list)));
  }
  const rows = items(list).map((item) => renderItem(list, item, canEdit));
  const children = [heading, tools];
  if (state.editing && state.editing.kind === 'title' && state.editing.id === list.id) {
    children.push(editForm('rename', 'New title', list.title, 'rename', (title) => rename(list, title)));
  }
  if (state.sharePanel && list.access === 'owner') children.push(renderSharePanel(list));
  children.push(el('ul', { id: 'items', class: 'items' }, ...rows));
  if (rows.length === 0) children.push(el('p', { class: 'help', text: 'No items yet.' }));
  if (canEdit) children.push(renderAddForm(list));
  main.replaceChildren(...children);
}

function renderItem(list, item, canEdit) {
  const box = el('input', { type: 'checkbox', id: 'done-' + item.id, checked: item.done, disabled: !canEdit,
                            onchange: (event) => setDone(list, item, event.target.checked) });
  const row = el('li', { class: 'item' + (item.done ? ' done' : ''), 'data-item': item.id },
    box, el('label', { for: 'done-' + item.id, class: 'text', text: item.text }));
  const tags = el('span', { class: 'tags' });
  item.tags.forEach((tag, index) => {
    const chip = el('span', { class: 'tag' }, el('span', { text: '#' + tag }));
    if (canEdit) chip.append(el('button', { type: 'button', class: 'tag-remove', id: `untag-${item.id}-${index}`,
                                            'aria-label': `Remove tag ${tag}`, onclick: () => {
                                              state.focusAfter = 'tag-' + item.id;
                                              changeTags(list, item, [], [tag]);
                                            } }, document.createTextNode('×')));
    tags.append(chip);
  });
  row.append(tags);
  if (canEdit) {
    row.append(el('span', { class: 'item-tools' },
      el('button', { type: 'button', class: 'button small secondary edit', id: 'edit-' + item.id, 'aria-label': `Edit ${item.text}`, onclick: () => {
        state.editing = { kind: 'text', id: item.id };
        render();
        $('edit-input').focus();
      } }, document.createTextNode('Edit')),
      el('button', { type: 'button', class: 'button small secondary add-tag', id: 'tag-' + item.id, 'aria-label': `Add a tag to ${item.text}`, onclick: () => {
        state.editing = { kind: 'tag', id: item.id };
        render();
        $('tag-input').focus();
      } }, document.createTextNode('+ Tag')),
      el('button', { type: 'button', class: 'button small danger remove', id: 'remove-' + item.id, 'aria-label': `Remove ${item.text}`,
                     onclick: () => {
                       // The focus goes on to the next item's box (or the previous one's, or the new-item field).
                       const all = items(list);
                       const at = all.findIndex((i) => i.id === item.id);
                       const neighbour = all[at + 1] || all[at - 1];
                       state.focusAfter = neighbour ? 'done-' + neighbour.id : 'new-item';
                       removeItem(list, item);
                     } }, document.createTextNode('Remove'))));
  }
  if (canEdit && state.editing && state.editing.id === item.id) {
    if (state.editing.kind === 'text') {
      row.append(editForm('edit', 'Item text', item.text, 'edit-' + item.id, (text) => { if (text !== item.text) setText(list, item, text); }));
    } else if (state.editing.kind === 'tag') {
      row.append(editForm('tag', 'New tag', '', 'tag-' + item.id, (tag) => changeTags(list, item, [tag], [])));
    }
  }
  return row;
}

/** An inline form with one text field; Escape or Cancel closes it, and the focus goes back to `opener`. */
function editForm(name, label, value, opener, save) {
  const input = el('input', { id: name + '-input', maxlength: 1000 });
  input.value = value;
  const close = () => { state.editing = null; state.focusAfter = opener; render(); };
  input.addEventListener('keydown', (event) => { if (event.key === 'Escape') close(); });
  return el('form', { class: 'inline edit-form', id: name + '-form', onsubmit: (event) => {
    event.preventDefault();
    const text = input.value.trim();
    state.editing = null;
    state.focusAfter = opener;
    if (text) save(text); else render();
  } }, el('label', { for: name + '-input', text: label }), input,
  el('button', { type: 'submit', class: 'button small', id: name + '-save', text: 'Save' }),
  el('button', { type: 'button', class: 'button small secondary', id: name + '-cancel', text: 'Cancel', onclick: close }));
}

/** A button that asks again in place (no dialog) before it acts. */
function confirmButton(id, label, question, action) {
  const button = el('button', { type: 'button', class: 'button danger', id }, document.createTextNode(label));
  button.addEventListener('click', () => {
    if (button.dataset.armed === 'true') { state.focusAfter = 'new-list-title'; action(); return; }
    button.dataset.armed = 'true';
    button.textContent = question + '? Press again';
    setTimeout(() => { if (button.isConnected) { button.dataset.armed = ''; button.textContent = label; } }, 5000);
  });
  return button;
}

function renderAddForm(list) {
  const text = el('input', { id: 'new-item', required: true, maxlength: 1000, placeholder: 'Item' });
  const tags = el('input', { id: 'new-item-tags', placeholder: 'tags, comma separated' });
  return el('form', { id: 'add-item', class: 'inline', onsubmit: (event) => {
    event.preventDefault();
    const value = text.value.trim();
    if (!value) return;
    const tagList = tags.value.split(',').map((t) => t.trim()).filter(Boolean);
    // Cleared before the write re-renders the page (a render keeps what the fields hold).
    text.value = '';
    tags.value = '';
    addItem(list, value, tagList);
    const field = document.getElementById('new-item');
    if (field) field.focus();
  } },
  el('label', { for: 'new-item', text: 'Add an item' }), text,
  el('label', { for: 'new-item-tags', class: 'visually-hidden', text: 'Tags' }), tags,
  el('button', { type: 'submit', class: 'button', id: 'add-item-button', text: 'Add' }));
}

function renderSharePanel(list) {
  const panel = el('section', { class: 'share-panel', id: 'share-panel', 'aria-labelledby': 'share-heading' },
    el('h3', { id: 'share-heading', text: 'Share' }));
  const permission = el('select', { id: 'link-permission' },
    el('option', { value: 'readOnly', text: 'can view' }), el('option', { value: 'readWrite', text: 'can edit' }));
  const expiry = el('select', { id: 'link-expiry' },
    el('option', { value: '', text: 'never expires' }), el('option', { value: '3600', text: 'expires in 1 hour' }),
    el('option', { value: '86400', text: 'expires in 1 day' }), el('option', { value: '604800', text: 'expires in 7 days' }));
  const single = el('input', { type: 'checkbox', id: 'link-single' });
  const output = el('input', { id: 'link-url', readonly: true, 'aria-label': 'Share link' });
  const copy = el('button', { type: 'button', class: 'button secondary', id: 'copy-link', disabled: !state.sharePanel.url,
                              onclick: () => copyLink(output) }, document.createTextNode('Copy'));
  panel.append(el('form', { class: 'inline', id: 'link-form', onsubmit: async (event) => {
    event.preventDefault();
    try {
      const reply = await makeLink(list, permission.value, Number(expiry.value) || 0, single.checked);
      // The panel may have been redrawn meanwhile (the new share arrived): show the link by redrawing.
      if (state.sharePanel) { state.sharePanel.url = reply.url; render(); }
    } catch (error) { notice('No link: ' + (error.reason || error.message), true); }
  } },
  el('label', { for: 'link-permission', text: 'Anyone with the link' }), permission,
  el('label', { for: 'link-expiry', class: 'visually-hidden', text: 'Expiry' }), expiry,
  el('span', { class: 'check' }, single, el('label', { for: 'link-single', text: 'single use' })),
  el('button', { type: 'submit', class: 'button', id: 'make-link', text: 'Make link' })));
  if (state.sharePanel.url) output.value = state.sharePanel.url;
  panel.append(el('p', { class: 'inline' }, output, copy));

  const name = el('input', { id: 'invite-name', required: true, maxlength: 64, autocomplete: 'off' });
  const invitePermission = el('select', { id: 'invite-permission' },
    el('option', { value: 'readOnly', text: 'can view' }), el('option', { value: 'readWrite', text: 'can edit' }));
  panel.append(el('form', { class: 'inline', id: 'invite-form', onsubmit: async (event) => {
    event.preventDefault();
    try {
      await shareModify(list, [{ operation: 'invite', userName: name.value.trim(), permission: invitePermission.value }]);
      notice(`Invited ${name.value.trim()}.`);
      name.value = '';
      await loadParticipants(list);
    } catch (error) { notice('Not invited: ' + (error.reason || error.message), true); }
  } }, el('label', { for: 'invite-name', text: 'Invite by user name' }), name,
  el('label', { for: 'invite-permission', class: 'visually-hidden', text: 'Permission' }), invitePermission,
  el('button', { type: 'submit', class: 'button', id: 'invite-button', text: 'Invite' })));

  const people = el('ul', { id: 'participants', class: 'participants' });
  for (const p of state.sharePanel.participants || []) people.append(renderParticipant(list, p));
  panel.append(el('h4', { text: 'People' }), people);
  if (!state.sharePanel.participants) loadParticipants(list);
  return panel;
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

function renderParticipant(list, p) {
  const row = el('li', { 'data-participant': p.name },
    el('span', { class: 'name', text: p.name }),
    el('span', { class: 'meta', text: ` ${roleWords[p.role] || p.role} · ${permissionWords[p.permission] || p.permission} · ${p.acceptanceStatus}` }));
  if (p.role !== 'owner') {
    const select = el('select', { id: 'participant-permission-' + p.name, 'aria-label': `Permission of ${p.name}`, onchange: async (event) => {
      try { await shareModify(list, [{ operation: 'setPermission', userName: p.name, permission: event.target.value }]); await loadParticipants(list); }
      catch (error) { notice('Not changed: ' + (error.reason || error.message), true); await loadParticipants(list); }
    } }, el('option', { value: 'readOnly', text: 'can view', selected: p.permission === 'readOnly' }),
    el('option', { value: 'readWrite', text: 'can edit', selected: p.permission === 'readWrite' }));
    row.append(select, el('button', { type: 'button', class: 'button small danger', id: 'participant-remove-' + p.name,
                                      'aria-label': `Remove ${p.name}`, onclick: async () => {
      try { await shareModify(list, [{ operation: 'remove', userName: p.name }]); await loadParticipants(list); }
      catch (error) { notice('Not removed: ' + (error.reason || error.message), true); }
    } }, document.createTextNode('Remove')));
  }
  return row;
}

async function loadParticipants(given) {
  if (!state.sharePanel) return;
  const list = lists().find((l) => l.id === given.id) || given; // the share may be newer than `given`
  if (!list.share) { state.sharePanel.participants = []; renderPanelParticipants(); return; }
  try {
    const share = await state.api.call(list.zone.database, 'shares/lookup', shareBody(list));
    if (state.sharePanel) state.sharePanel.participants = share.participants || [];
  } catch (error) {
    if (state.sharePanel) state.sharePanel.participants = [];
  }
  renderPanelParticipants();
}

function renderPanelParticipants() {
  const list = lists().find((l) => l.id === state.openList);
  const people = $('participants');
  if (!list || !people || !state.sharePanel) return;
  people.replaceChildren(...(state.sharePanel.participants || []).map((p) => renderParticipant(list, p)));
}

async function leave(list) {
  try {
    await state.api.call('shared', 'shares/leave', shareBody(list));
    state.deletedHere.set(list.id, 'Left');
    await refresh();
  } catch (error) { notice('Not left: ' + (error.reason || error.message), true); }
}

// MARK: Start

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
  state.session = await currentSession();
  if (!state.session) { location.replace('/'); return; }
  state.api = new Api(state.session);
  $('who').textContent = state.session.name;
  $('signout').addEventListener('click', async () => {
    try { await state.api.signOut(); } finally { location.replace('/'); }
  });
  $('new-list').addEventListener('submit', (event) => {
    event.preventDefault();
    const input = $('new-list-title');
    const title = input.value.trim();
    input.value = '';
    if (title) createList(title);
  });
  const wanted = hashValue('list');
  await refresh(true);
  if (wanted && lists().some((l) => l.id === wanted)) open(wanted);
  window.addEventListener('hashchange', async () => {
    const secret = hashValue('signin');
    if (secret) { // a sign-in link opened in this tab: another account's asks the person first
      history.replaceState(null, '', '/');
      try {
        if (await followSignInLink(secret, document.body)) { announceSignIn(); location.reload(); }
      } catch (error) { notice(error.reason, true); }
      return;
    }
    const list = hashValue('list');
    if (list && list !== state.openList && lists().some((l) => l.id === list)) open(list);
  });
  document.body.dataset.ready = 'true';
  // Invitations are not in the change feeds (the invitee has no access yet): asked now and every minute.
  loadInvitations();
  setInterval(loadInvitations, 60 * 1000);
  const recovered = sessionStorage.getItem('lattice.recoveryNotice');
  if (recovered) { sessionStorage.removeItem('lattice.recoveryNotice'); notice(recovered); }
  // A session renews while used (GET /auth/session past half its life): ask every six hours while open.
  setInterval(() => { currentSession().catch(() => {}); }, 6 * 3600 * 1000);
  watch();
}

start().catch((error) => notice(error.reason || error.message, true));
