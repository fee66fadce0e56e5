// The browser's replica of the account's lists: what the server last gave (kept in IndexedDB with each
// zone's change token), plus the changes made here that are not yet acknowledged (the outbox, also kept).
// What the page shows is the join of the two (crdt.js), so an edit shows at once, survives a reload and
// an outage, and is sent, in order and once (clientOperationID), when the server can be reached.
import { ApiError, currentSession } from './api.js';
import { Clock, joinRecords, newReplicaID } from './crdt.js';
import { Store, rememberSession } from './store.js';

export const zoneKey = (database, zoneID) => `${database}|${zoneID.ownerRecordName || ''}|${zoneID.zoneName}`;

/** Whether an error means "not now" (no network, server down or busy) rather than a refusal. */
export function isUnreachable(error) {
  if (error instanceof ApiError) {
    return [0, 408, 429, 500, 502, 503, 504].includes(error.status) || error.code === 'TRY_AGAIN_LATER' || error.code === 'THROTTLED';
  }
  return !(error && error.name === 'AbortError');
}

const isSignedOut = (error) => error instanceof ApiError && (error.status === 401 || error.status === 421);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const randomHex = (n) => Array.from(crypto.getRandomValues(new Uint8Array(n)), (b) => b.toString(16).padStart(2, '0')).join('');

/** Takes a Web Lock for as long as the page lives; false when another tab holds it (true without locks). */
function holdLock(name) {
  if (!navigator.locks) return Promise.resolve(true);
  return new Promise((resolve) => {
    navigator.locks.request(name, { ifAvailable: true }, (lock) => {
      resolve(!!lock);
      return lock ? new Promise(() => {}) : undefined; // held until the tab closes
    }).catch(() => resolve(true));
  });
}

/** A replica id of this tab alone (kept across its reloads). */
function tabReplica() {
  let id = sessionStorage.getItem('lattice.tabReplica');
  if (!id) { id = newReplicaID(); sessionStorage.setItem('lattice.tabReplica', id); }
  return id;
}

export class Replica {
  /**
   * `listener` gets `changed(changes)` ([{key, name, before, after, remote}]), `status(status)`,
   * `refused(entry, reason)`, `lost(entry, record, shown)` (an edit that reached a record deleted
   * meanwhile, with the record as the page showed it, the edit included, when known) and
   * `zoneGone(zone, entries)` (a zone deleted or no longer shared, with the unsent entries it dropped).
   */
  constructor(api, listener) {
    this.api = api;
    this.listener = listener;
    this.store = null;
    this.clock = null;
    this.tokens = { private: null, shared: null };
    /** zone key -> {key, database, zoneID, token, complete, ownerName} */
    this.zones = new Map();
    /** zone key -> Map(name -> the server's last state) */
    this.server = new Map();
    /** the unsent changes, oldest first */
    this.outbox = [];
    /** userRecordName -> name */
    this.names = new Map();
    /** "zone|name" -> the last live state of a record removed while this page was open */
    this.lastLive = new Map();
    this.online = null;
    this.signedOut = false;
    /** the entry on its way to the server */
    this.sending = null;
    this.flushing = null;
    this.wake = null;
  }

  // MARK: Loading

  /** Opens the account's database and reads what it holds; whether it held any zone. */
  async load() {
    const session = this.api.session;
    this.store = await Store.open(session.userRecordName);
    let replica = null, latest = null;
    if (this.store) {
      replica = await this.store.getMeta('replica');
      latest = await this.store.getMeta('clock');
      this.tokens = (await this.store.getMeta('tokens')) || this.tokens;
      for (const [id, name] of Object.entries((await this.store.getMeta('names')) || {})) this.names.set(id, name);
      for (const zone of await this.store.all('zones')) { this.zones.set(zone.key, zone); this.server.set(zone.key, new Map()); }
      for (const row of await this.store.all('records')) {
        if (!this.server.has(row.zone)) continue;
        this.server.get(row.zone).set(row.name, row.record);
      }
      this.outbox = (await this.store.all('outbox')).sort((a, b) => a.seq - b.seq);
      for (const entry of this.outbox) entry.saved = Promise.resolve();
    }
    if (!replica) {
      replica = newReplicaID();
      if (this.store) await this.store.setMeta('replica', replica);
    }
    // Two tabs must not stamp with one replica id (two writes could get the same stamp): the browser's id
    // is held by one tab at a time (a Web Lock, released when the tab goes); another tab makes its own.
    if (!(await holdLock('lattice-replica-' + session.userRecordName))) replica = tabReplica();
    this.clock = new Clock(replica, latest);
    for (const records of this.server.values()) for (const record of records.values()) this.clock.observeRecord(record);
    for (const entry of this.outbox) for (const state of entry.states || []) this.clock.observeRecord(state);
    this.names.set(session.userRecordName, session.name);
    return this.zones.size > 0;
  }

  /**
   * A first load with nothing kept: the zones, then only the lists' titles (and, in shared zones, the
   * shares that say the access), with records/query, and the whole zone of `wantedList` if one is
   * asked for. The rest comes with the next sync. Requests that do not depend on each other go together:
   * on a slow network the round trips, not the bytes, decide how soon the lists show.
   */
  async coldStart(wantedList) {
    const query = async (database, zoneID, recordType) => {
      const records = [];
      let marker = null;
      for (let page = 0; page < 50; page += 1) {
        const body = { zoneID, query: { recordType }, resultsLimit: 200 };
        if (marker) body.continuationMarker = marker;
        let reply;
        try { reply = await this.api.call(database, 'records/query', body); } catch (error) {
          if (isUnreachable(error) || isSignedOut(error)) throw error;
          break; // a type not answered here: the sync brings it
        }
        records.push(...(reply.records || []));
        marker = reply.continuationMarker;
        if (!marker) break;
      }
      return records;
    };
    // Both databases' zones together, then every zone's titles together (a zone is asked only once it is
    // known to exist: a missing one would answer 404).
    const [privateZones, sharedZones] = await Promise.all([
      this.api.call('private', 'changes/database', {}), this.api.call('shared', 'changes/database', {})]);
    for (const [database, reply] of [['private', privateZones], ['shared', sharedZones]]) {
      for (const entry of reply.zones || []) if (!entry.deleted) this.addZone(database, entry.zoneID);
      if (!reply.moreComing) this.tokens[database] = reply.syncToken; // else the sync pages through from the start
    }
    const asked = [];
    for (const zone of this.zones.values()) {
      const types = zone.database === 'shared' ? ['List', 'cloudkit.share'] : ['List'];
      for (const type of types) asked.push(query(zone.database, zone.zoneID, type).then((records) => [zone, records]));
    }
    const changes = [];
    for (const [zone, records] of await Promise.all(asked)) for (const record of records) changes.push(this.take(zone, record));
    await this.persist(changes.filter(Boolean));
    if (wantedList) {
      const zone = [...this.zones.values()].find((z) => this.server.get(z.key).has(wantedList));
      if (zone) await this.fetchZone(zone);
    }
    this.report(changes.filter(Boolean));
  }

  addZone(database, zoneID) {
    const key = zoneKey(database, zoneID);
    if (!this.zones.has(key)) {
      this.zones.set(key, { key, database, zoneID, token: null, complete: false, ownerName: null });
      this.server.set(key, new Map());
    }
    return this.zones.get(key);
  }

  // MARK: What the page shows

  /** The records of a zone as shown: the server's state joined with every unsent change. */
  view(key) {
    const result = new Map(this.server.get(key) || []);
    for (const entry of this.outbox) {
      if (entry.zone !== key) continue;
      for (const state of entry.states || []) result.set(state.recordName, joinRecords(result.get(state.recordName), state));
    }
    return result;
  }

  /** One record as shown (the server's state joined with the unsent changes to it). */
  record(key, name) {
    let result = (this.server.get(key) || new Map()).get(name);
    for (const entry of this.outbox) {
      if (entry.zone !== key) continue;
      for (const state of entry.states || []) if (state.recordName === name) result = joinRecords(result, state);
    }
    return result;
  }

  /** The unsent entries that touch a record. */
  pendingFor(key, name) {
    return this.outbox.filter((e) => e.zone === key && (e.states || []).some((s) => s.recordName === name));
  }

  status() {
    return { online: this.online, pending: this.outbox.length, signedOut: this.signedOut };
  }

  // MARK: Changes made here

  /**
   * Queues a change: `states` are the records as this change leaves them (shown at once and kept),
   * `operations` what records/modify is sent (CRDT states, or a plain forceDelete). Sent at once when
   * the server can be reached, else when it can again. With `extra.coalesce` (a key), a change that
   * follows a waiting one of the same key (not being sent) replaces it: `states` must hold what it held.
   */
  queue(zone, states, operations, label, extra = {}) {
    const before = states.map((s) => this.record(zone.key, s.recordName));
    const body = JSON.stringify({ zoneID: zone.zoneID, atomic: false, clientOperationID: `web-${this.clock.replica}-${randomHex(8)}`,
                                  operations });
    const kept = { zone: zone.key, database: zone.database, path: 'records/modify', body, states, label, made: Date.now(), ...extra };
    const last = this.outbox[this.outbox.length - 1];
    if (extra.coalesce && last && last.coalesce === extra.coalesce && last.zone === zone.key && this.sending !== last) {
      // A run of edits of one thing (a note typed into, key by key) keeps one waiting entry: the new state
      // was made from what the page shows, which holds the waiting one's, so it replaces it in its place. It
      // is a new operation (its own clientOperationID): a try of the old one may have reached the server.
      Object.assign(last, { body, states, label });
      last.saved = last.saved.then(() => (this.store && last.seq ? this.store.putOutbox({ ...kept, made: last.made, seq: last.seq }) : null))
        .catch(() => {});
      if (this.store) this.store.setMeta('clock', this.clock.latest).catch(() => {});
      this.report(states.map((s, i) => ({ key: zone.key, name: s.recordName, before: before[i], after: this.record(zone.key, s.recordName), remote: false })));
      this.flush();
      return last;
    }
    // Shown and queued at once; sent only once it is kept (`saved`), so a reload never loses a sent change.
    const entry = { ...kept };
    entry.saved = (this.store ? this.store.addOutbox(kept) : Promise.resolve((this.localSeq = (this.localSeq || 0) + 1)))
      .then((seq) => { entry.seq = seq; }, () => { entry.seq = null; });
    this.outbox.push(entry);
    if (this.store) this.store.setMeta('clock', this.clock.latest).catch(() => {});
    this.report(states.map((s, i) => ({ key: zone.key, name: s.recordName, before: before[i], after: this.record(zone.key, s.recordName), remote: false })));
    this.flush();
    return entry;
  }

  /** Forgets a kept entry (sent, refused, cancelled or dropped). */
  async forget(entry) {
    await entry.saved;
    if (this.store && entry.seq) await this.store.removeOutbox(entry.seq);
  }

  /** Takes back an unsent entry (undo before it left); false when it is being sent or already was. */
  async cancel(entry) {
    const index = this.outbox.indexOf(entry);
    if (index < 0 || this.sending === entry) return false;
    const before = (entry.states || []).map((s) => this.record(entry.zone, s.recordName));
    this.outbox.splice(index, 1);
    await this.forget(entry);
    this.report((entry.states || []).map((s, i) => ({ key: entry.zone, name: s.recordName, before: before[i],
                                                       after: this.record(entry.zone, s.recordName), remote: false })));
    return true;
  }

  /** Sends the outbox in order, one entry at a time; stops at the first "not now". */
  flush() {
    if (!this.flushing) {
      this.flushing = this.flushOnce().finally(() => { this.flushing = null; });
    }
    return this.flushing;
  }

  async flushOnce() {
    while (this.outbox.length && !this.signedOut) {
      const entry = this.outbox[0];
      if (!this.api.session.csrfToken) {
        try { await this.refreshSession(); } catch (error) { this.failed(error); return; }
      }
      await entry.saved;
      if (this.outbox[0] !== entry) continue; // cancelled meanwhile
      this.sending = entry;
      let reply;
      try {
        reply = await this.api.send(entry.database, entry.path, entry.body);
      } catch (error) {
        this.sending = null;
        if (isSignedOut(error)) { this.failed(error); return; }
        if (isUnreachable(error)) { this.failed(error); return; }
        if (error instanceof ApiError && error.status === 403 && !entry.retriedSession) {
          entry.retriedSession = true; // a stale CSRF value: ask for the session again, then retry once
          try { await this.refreshSession(); } catch (again) { this.failed(again); return; }
          continue;
        }
        await this.settle(entry, [], error.reason || error.message);
        continue;
      }
      this.sending = null;
      this.setOnline(true);
      await this.settle(entry, reply.records || [], null);
    }
  }

  /** An entry answered: the records it wrote join the server's state; refusals are reported. */
  async settle(entry, answered, wholeRefusal) {
    const zone = this.zones.get(entry.zone);
    const before = (entry.states || []).map((s) => this.record(entry.zone, s.recordName));
    const changes = [];
    let refusal = wholeRefusal;
    const lost = [];
    for (const record of answered) {
      if (record.serverErrorCode) {
        // A delete of what is already gone did what it meant to.
        if (record.serverErrorCode === 'NOT_FOUND' && entry.kind === 'delete') continue;
        refusal = refusal || record.reason || record.serverErrorCode;
        continue;
      }
      if (record.deleted && entry.kind !== 'delete') {
        // The edit reached a record removed meanwhile: the removal wins. What the person saw, with the
        // edit, is kept for bringing it back.
        const index = (entry.states || []).findIndex((s) => s.recordName === record.recordName);
        const shown = index >= 0 && before[index] && !before[index].deleted ? before[index]
          : joinRecords(this.lastLive.get(`${entry.zone}|${record.recordName}`), index >= 0 ? entry.states[index] : null);
        lost.push([record, shown && !shown.deleted ? shown : null]);
      }
      if (zone) changes.push(this.take(zone, record));
    }
    this.outbox.splice(this.outbox.indexOf(entry), 1);
    await this.forget(entry);
    await this.persist(changes.filter(Boolean));
    this.report((entry.states || []).map((s, i) => ({ key: entry.zone, name: s.recordName, before: before[i],
                                                       after: this.record(entry.zone, s.recordName), remote: false })));
    if (refusal) this.listener.refused(entry, refusal);
    for (const [record, shown] of lost) this.listener.lost(entry, record, shown);
  }

  // MARK: Syncing

  /** Runs for as long as the page is open: send, fetch what changed, wait for more; retry when offline. */
  async run() {
    let delay = 1000;
    window.addEventListener('online', () => this.nudge());
    for (;;) {
      try {
        if (this.signedOut || !this.api.session.csrfToken) await this.refreshSession();
        await this.flush();
        await this.sync();
        this.setOnline(true); // the feeds answered
        await this.flush();
        // A send that failed since: try again soon rather than park a long poll.
        if (this.outbox.length && this.online === false) throw new ApiError('TRY_AGAIN_LATER', 'not sent yet', 503);
        delay = 1000;
        await this.waitForServer();
      } catch (error) {
        if (isSignedOut(error)) {
          this.failed(error);
          await this.pause(5000);
          continue;
        }
        if (error instanceof ApiError && error.code === 'CHANGE_TOKEN_EXPIRED') {
          this.tokens = { private: null, shared: null };
          continue;
        }
        this.failed(error);
        await this.pause(delay);
        delay = Math.min(delay * 2, 3000);
      }
    }
  }

  /**
   * Waits until either database moves past its token, or 25 s: on the page's push stream when it has one (a
   * notification ends the wait at once; a 0 s changes/wait first catches what came before the stream), else
   * with a parked changes/wait long poll.
   */
  async waitForServer() {
    const databases = [{ database: 'private', syncToken: this.tokens.private }, { database: 'shared', syncToken: this.tokens.shared }];
    this.startPush();
    if (this.push && this.push.connected) {
      const now = await this.api.call('private', 'changes/wait', { databases, timeout: 0 });
      if (!now.changed) await this.pushed(25000);
      return;
    }
    await this.api.call('private', 'changes/wait', { databases, timeout: 25 });
  }

  /**
   * The push stream of this page (GET /push/{token}, server-sent events): a push token of the page's session
   * (tokens/create, tokens/register) and a database subscription of each database, made once; EventSource
   * reconnects by itself (with Last-Event-ID). A server without push streams leaves the page on long polls.
   */
  startPush() {
    if (this.pushStarted || typeof EventSource === 'undefined') return;
    this.pushStarted = true;
    (async () => {
      try {
        const made = await this.api.call('private', 'tokens/create', { apnsEnvironment: 'production' });
        if (!made.apnsToken || !made.webcourierURL) return;
        await this.api.call('private', 'tokens/register', { apnsEnvironment: 'production', apnsToken: made.apnsToken });
        for (const database of ['private', 'shared']) {
          await this.api.call(database, 'subscriptions/modify', { operations: [{ operationType: 'create',
            subscription: { subscriptionID: `lattice.web.${database}`, subscriptionType: 'database' } }] });
        }
        const source = new EventSource(new URL(made.webcourierURL).pathname);
        const push = { source, connected: false, notified: false, wake: null };
        const mark = (on) => { if (typeof document !== 'undefined') document.body.dataset.push = on ? 'on' : 'off'; };
        source.addEventListener('ready', () => { push.connected = true; mark(true); });
        source.addEventListener('notification', () => {
          push.notified = true;
          if (push.wake) push.wake();
        });
        source.addEventListener('revoked', () => { source.close(); this.push = null; this.pushStarted = false; });
        source.onerror = () => { push.connected = false; mark(false); if (push.wake) push.wake(); };
        this.push = push;
      } catch (error) {
        this.pushStarted = false; // tried again at the next wait
      }
    })();
  }

  /** Waits for a push notification (true), at most `ms` (false); a notification since the last wait counts. */
  pushed(ms) {
    const push = this.push;
    return new Promise((resolve) => {
      if (push.notified) { push.notified = false; return resolve(true); }
      const timer = setTimeout(() => { push.wake = null; resolve(false); }, ms);
      push.wake = () => { clearTimeout(timer); push.wake = null; const notified = push.notified; push.notified = false; resolve(notified); };
    });
  }

  /** Waits `ms`, or less when the browser says it is online again. */
  pause(ms) {
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, ms);
      this.wake = () => { clearTimeout(timer); resolve(); };
    });
  }

  nudge() {
    if (this.wake) this.wake();
    if (this.push && this.push.wake) this.push.wake();
  }

  async refreshSession() {
    const session = await currentSession();
    if (!session) { this.signedOut = true; this.emitStatus(); throw new ApiError('AUTHENTICATION_REQUIRED', 'signed out', 401); }
    if (session.userRecordName !== this.api.session.userRecordName) { location.replace('/'); throw new Error('another account'); }
    this.api.session = session;
    this.signedOut = false;
    rememberSession(session);
    this.setOnline(true);
  }

  failed(error) {
    if (isSignedOut(error)) { this.signedOut = true; this.emitStatus(); return; }
    if (isUnreachable(error)) this.setOnline(false);
  }

  setOnline(online) {
    if (this.online === online) return;
    this.online = online;
    this.emitStatus();
    if (online) this.flush();
  }

  emitStatus() { this.listener.status(this.status()); }

  /** Fetches what changed in both databases since their tokens, and every zone not yet complete. */
  async sync() {
    const changes = [];
    for (const database of ['private', 'shared']) {
      const changed = new Set();
      let more = true;
      for (let page = 0; more && page < 100; page += 1) {
        let reply;
        try {
          reply = await this.api.call(database, 'changes/database', this.tokens[database] ? { syncToken: this.tokens[database] } : {});
        } catch (error) {
          if (error instanceof ApiError && error.code === 'CHANGE_TOKEN_EXPIRED') { this.tokens[database] = null; continue; }
          throw error;
        }
        for (const entry of reply.zones || []) {
          const key = zoneKey(database, entry.zoneID);
          if (entry.deleted) { await this.dropZone(key); continue; }
          this.addZone(database, entry.zoneID);
          changed.add(key);
        }
        this.tokens[database] = reply.syncToken;
        more = reply.moreComing === true;
      }
      for (const zone of [...this.zones.values()]) {
        if (zone.database !== database || !(changed.has(zone.key) || !zone.complete)) continue;
        changes.push(...await this.fetchZone(zone, false));
      }
      if (this.store) await this.store.setMeta('tokens', this.tokens);
    }
    this.report(changes);
    for (const zone of this.zones.values()) if (zone.database === 'shared' && !zone.ownerName) await this.lookUpNames(zone);
  }

  /** Fetches a zone's changes since its token (all of it without one); reports unless `report` is false. */
  async fetchZone(zone, report = true) {
    const changes = [];
    for (let page = 0; page < 1000; page += 1) {
      const request = { zoneID: zone.zoneID };
      if (zone.token) request.syncToken = zone.token;
      const reply = await this.api.call(zone.database, 'changes/zone', { zones: [request] });
      const answer = (reply.zones || [])[0] || {};
      if (answer.serverErrorCode === 'CHANGE_TOKEN_EXPIRED') {
        zone.token = null;
        zone.complete = false;
        const gone = [...this.server.get(zone.key).keys()];
        this.server.set(zone.key, new Map());
        if (this.store) await this.store.save({ records: gone.map((name) => ({ zone: zone.key, name, record: null })) });
        continue;
      }
      if (answer.serverErrorCode) { await this.dropZone(zone.key); return changes; }
      const batch = [];
      for (const record of answer.records || []) batch.push(this.take(zone, record));
      zone.token = answer.syncToken;
      if (!answer.moreComing) zone.complete = true;
      await this.persist(batch.filter(Boolean), [zone]);
      changes.push(...batch.filter(Boolean));
      if (!answer.moreComing) break;
    }
    if (report) this.report(changes);
    return changes;
  }

  /**
   * Asks the server for records again (`records/lookup`), for fresh download URLs of their assets (a URL
   * works for an hour; the kept state holds the last one given). Joined as any answer is: the same write of
   * an asset takes the newer URL (crdt.js).
   */
  async refresh(zone, names) {
    if (!this.zones.has(zone.key) || !names.length) return;
    const reply = await this.api.call(zone.database, 'records/lookup', { zoneID: zone.zoneID, records: names.map((recordName) => ({ recordName })) });
    const changes = (reply.records || []).filter((r) => !r.serverErrorCode).map((r) => this.take(zone, r)).filter(Boolean);
    await this.persist(changes);
    this.report(changes);
  }

  /** A record the server gave: joined into its last state (answers and feeds may cross), or dropped. */
  take(zone, record) {
    const records = this.server.get(zone.key);
    if (!records) return null;
    const before = this.record(zone.key, record.recordName);
    if (!record.crdt) {
      if (!record.deleted) return null;
      records.delete(record.recordName); // left the shared hierarchy, or a share lost: no longer ours to see
    } else {
      this.clock.observeRecord(record);
      const known = records.get(record.recordName);
      const joined = joinRecords(known, record);
      if (known && !known.deleted && joined.deleted) this.rememberLive(zone.key, known);
      records.set(record.recordName, joined);
    }
    return { key: zone.key, name: record.recordName, before, after: this.record(zone.key, record.recordName), remote: true,
             record: records.get(record.recordName) || null };
  }

  /** The last live state of a record that was just removed (a few hundred at most), to bring it back. */
  rememberLive(key, record) {
    this.lastLive.set(`${key}|${record.recordName}`, record);
    if (this.lastLive.size > 500) this.lastLive.delete(this.lastLive.keys().next().value);
  }

  async persist(changes, zones = []) {
    if (!this.store) return;
    await this.store.save({ records: changes.map((c) => ({ zone: c.key, name: c.name, record: c.record })), zones });
  }

  /** A zone deleted, or no longer shared with us: its records and unsent changes go. */
  async dropZone(key) {
    const zone = this.zones.get(key);
    if (!zone) return;
    const changes = [...(this.server.get(key) || new Map()).keys()].map((name) => ({ key, name, before: this.record(key, name), after: null, remote: true }));
    const dropped = this.outbox.filter((e) => e.zone === key && e !== this.sending);
    this.outbox = this.outbox.filter((e) => !dropped.includes(e));
    for (const entry of dropped) await this.forget(entry);
    this.zones.delete(key);
    this.server.delete(key);
    if (this.store) await this.store.save({ removeZones: [key] });
    this.report(changes);
    this.listener.zoneGone(zone, dropped);
  }

  /** The names of a shared zone's people (and so its owner), from the share's roster. */
  async lookUpNames(zone, shareRecordName = null) {
    try {
      const body = { zoneID: zone.zoneID };
      if (shareRecordName) body.shareRecordName = shareRecordName;
      const share = await this.api.call(zone.database, 'shares/lookup', body);
      this.learnNames(share.participants || []);
      const owner = (share.participants || []).find((p) => p.role === 'owner');
      if (owner && zone.database === 'shared') {
        zone.ownerName = owner.name;
        if (this.store) await this.store.save({ zones: [zone] });
      }
      return share;
    } catch (_) {
      return null; // the names stay unknown until the next try
    }
  }

  learnNames(participants) {
    let learned = false;
    for (const p of participants) {
      if (p.userRecordName && p.name && this.names.get(p.userRecordName) !== p.name) { this.names.set(p.userRecordName, p.name); learned = true; }
    }
    if (learned && this.store) this.store.setMeta('names', Object.fromEntries(this.names)).catch(() => {});
    return learned;
  }

  report(changes) {
    const real = changes.filter((c) => c && JSON.stringify(c.before || null) !== JSON.stringify(c.after || null));
    if (real.length) this.listener.changed(real);
    this.emitStatus();
  }
}
