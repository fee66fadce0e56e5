// What the web client keeps in the browser between loads: one IndexedDB database per account
// (`lattice-{userRecordName}`), holding
//   meta    key -> value: this browser's replica id, the clock, the databases' change tokens, names of people
//   zones   key -> {key, database, zoneID, token, complete, ownerName}: each zone and its change token
//   records [zone, name] -> {zone, name, record}: the last state the server gave of each record (with crdt)
//   outbox  seq -> {seq, zone, database, path, body, states, label, ...}: changes made here, not yet sent
// and, in localStorage, the signed-in account's name and ids (no secret) so the page can open offline.

const VERSION = 1;
const LAST_SESSION = 'lattice.lastSession';

function request(req) {
  return new Promise((resolve, reject) => {
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
}

function done(tx) {
  return new Promise((resolve, reject) => {
    tx.oncomplete = () => resolve();
    tx.onerror = () => reject(tx.error);
    tx.onabort = () => reject(tx.error || new Error('aborted'));
  });
}

export class Store {
  static nameFor(userRecordName) { return 'lattice-' + userRecordName; }

  /** Opens (making it if new) the database of one account; null where IndexedDB is unavailable. */
  static async open(userRecordName) {
    if (!self.indexedDB) return null;
    try {
      const open = indexedDB.open(Store.nameFor(userRecordName), VERSION);
      open.onupgradeneeded = () => {
        const db = open.result;
        db.createObjectStore('meta', { keyPath: 'key' });
        db.createObjectStore('zones', { keyPath: 'key' });
        db.createObjectStore('records', { keyPath: ['zone', 'name'] }).createIndex('zone', 'zone');
        db.createObjectStore('outbox', { keyPath: 'seq', autoIncrement: true });
      };
      const db = await request(open);
      // Another tab signing out deletes this database: let it (this tab is signed out too).
      db.onversionchange = () => db.close();
      return new Store(db);
    } catch (_) {
      return null; // a private window without storage: the page works without keeping anything
    }
  }

  /** Deletes an account's database (sign-out). */
  static async remove(userRecordName) {
    if (!self.indexedDB) return;
    const deleting = request(indexedDB.deleteDatabase(Store.nameFor(userRecordName))).catch(() => {});
    await Promise.race([deleting, new Promise((resolve) => setTimeout(resolve, 3000))]); // never held up by a stuck tab
  }

  constructor(db) { this.db = db; }

  close() { this.db.close(); }

  async all(storeName) {
    return request(this.db.transaction(storeName).objectStore(storeName).getAll());
  }

  async getMeta(key) {
    const row = await request(this.db.transaction('meta').objectStore('meta').get(key));
    return row ? row.value : undefined;
  }

  async setMeta(key, value) {
    const tx = this.db.transaction('meta', 'readwrite');
    tx.objectStore('meta').put({ key, value });
    return done(tx);
  }

  /** Writes records and zone rows in one transaction: `records` [{zone, name, record | null (delete)}]. */
  async save({ records = [], zones = [], removeZones = [] }) {
    const tx = this.db.transaction(['records', 'zones'], 'readwrite');
    const recordStore = tx.objectStore('records');
    const zoneStore = tx.objectStore('zones');
    for (const { zone, name, record } of records) {
      if (record) recordStore.put({ zone, name, record }); else recordStore.delete([zone, name]);
    }
    for (const zone of zones) zoneStore.put(zone);
    for (const key of removeZones) {
      zoneStore.delete(key);
      recordStore.delete(IDBKeyRange.bound([key, ''], [key, '\uffff']));
    }
    return done(tx);
  }

  async addOutbox(entry) {
    const tx = this.db.transaction('outbox', 'readwrite');
    const seq = await request(tx.objectStore('outbox').add(entry));
    await done(tx);
    return seq;
  }

  /** Rewrites a kept entry in place (same `seq`, so its place in the order stays). */
  async putOutbox(entry) {
    const tx = this.db.transaction('outbox', 'readwrite');
    tx.objectStore('outbox').put(entry);
    return done(tx);
  }

  async removeOutbox(seq) {
    const tx = this.db.transaction('outbox', 'readwrite');
    tx.objectStore('outbox').delete(seq);
    return done(tx);
  }
}

/** The last signed-in account ({name, userRecordName, container, environment}), for opening offline. */
export function lastSession() {
  try { return JSON.parse(localStorage.getItem(LAST_SESSION) || 'null'); } catch (_) { return null; }
}

export function rememberSession(session) {
  const { name, userRecordName, container, environment } = session;
  localStorage.setItem(LAST_SESSION, JSON.stringify({ name, userRecordName, container, environment }));
}

export function forgetSession() { localStorage.removeItem(LAST_SESSION); }
