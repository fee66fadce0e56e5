// The page's CRDT: the same join as the server's (Docs/Merge.md), on records in their JSON form, and the
// local edits as stamped states. A stamp is {ms, counter, replica} (replica: 16 lower-case hex digits).
// A field is one of four kinds: a last-writer-wins register (a scalar), an add-wins observed-remove set
// (`T_SET`), an ordered list that keeps duplicates (`T_LIST`) or a text merged character by character
// (`TEXT`); the last two are sequences, joined by sequence.js. Two states of different kinds under one name
// join to the greater kind (text > list > set > register). A record's generation and deletion stamp decide
// between a delete and edits (delete wins within a generation).
// Edits made here are stamped by this browser's hybrid logical clock, so an edit made offline keeps the
// moment it was made: an earlier edit loses to a later one whatever order they reach the server in.
import { emptySequence, isSequence, joinSequences, splice, textSplice } from './sequence.js';

/** Orders stamps: milliseconds, then counter, then replica id. */
export function compareStamps(a, b) {
  if (!a || !b) return a ? 1 : b ? -1 : 0;
  return (a.ms - b.ms) || (a.counter - b.counter) || (a.replica < b.replica ? -1 : a.replica > b.replica ? 1 : 0);
}

const greater = (a, b) => (compareStamps(a, b) >= 0 ? a : b);

/** A hybrid logical clock: never behind what it has seen, never behind the wall clock. */
export class Clock {
  constructor(replica, latest = null, now = () => Date.now()) {
    this.replica = replica;
    this.latest = latest || { ms: 0, counter: 0 };
    this.now = now;
  }

  /** A new stamp, greater than every stamp issued or observed. */
  stamp() {
    const physical = this.now();
    if (physical > this.latest.ms) this.latest = { ms: physical, counter: 0 };
    else if (this.latest.counter < 0xffff) this.latest = { ms: this.latest.ms, counter: this.latest.counter + 1 };
    else this.latest = { ms: this.latest.ms + 1, counter: 0 }; // the counter carries into the milliseconds
    return { ms: this.latest.ms, counter: this.latest.counter, replica: this.replica };
  }

  /** Moves the clock past a stamp seen elsewhere (ignored when it is more than 5 minutes ahead). */
  observe(stamp) {
    if (!stamp || typeof stamp.ms !== 'number' || stamp.ms > this.now() + 5 * 60 * 1000) return;
    if (stamp.ms > this.latest.ms || (stamp.ms === this.latest.ms && stamp.counter > this.latest.counter)) {
      this.latest = { ms: stamp.ms, counter: stamp.counter };
    }
  }

  /** Observes every stamp of a record: header, parent, each register's stamp, each set's, list's and text's context. */
  observeRecord(record) {
    const crdt = record && record.crdt;
    if (!crdt) return;
    this.observe(crdt.created);
    this.observe(crdt.deletion);
    this.observe(crdt.parent);
    for (const field of Object.values(record.fields || {})) {
      const meta = field && field.crdt;
      if (!meta) continue;
      this.observe(meta.stamp);
      for (const stamp of meta.context || []) this.observe(stamp);
    }
  }
}

/** A random replica id: 64 bits as 16 lower-case hex digits, never zero. */
export function newReplicaID() {
  const bytes = new Uint8Array(8);
  do { crypto.getRandomValues(bytes); } while (bytes.every((b) => b === 0));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
}

const isSet = (field) => !!(field && field.crdt && Array.isArray(field.crdt.entries));

/** A field's kind, as the server orders kinds: 0 register, 1 set, 2 list, 3 text. */
export function fieldKind(field) {
  if (isSet(field)) return 1;
  if (isSequence(field)) return field.type === 'TEXT' ? 3 : 2;
  return 0;
}

/** A set's type: `T_SET` (a set written as `T_LIST` before lists kept their order is a set all the same). */
const setType = (type) => (typeof type === 'string' && type.endsWith('_LIST') ? type.slice(0, -5) + '_SET' : type || 'STRING_SET');
const covers = (context, stamp) => context.some((c) => c.replica === stamp.replica
  && (c.ms > stamp.ms || (c.ms === stamp.ms && c.counter >= stamp.counter)));
const sameEntry = (a, b) => a.value === b.value && compareStamps(a.stamp, b.stamp) === 0;
const byBytes = (a, b) => (a < b ? -1 : a > b ? 1 : 0);

/** Joins two version vectors (arrays of stamps, one per replica): the greater stamp of each replica. */
function joinContexts(a, b) {
  const byReplica = new Map();
  for (const stamp of [...a, ...b]) {
    const known = byReplica.get(stamp.replica);
    if (!known || compareStamps(stamp, known) > 0) byReplica.set(stamp.replica, stamp);
  }
  return [...byReplica.values()].sort((x, y) => byBytes(x.replica, y.replica));
}

/** The set field of entries and context: its visible value is each element once, ascending. */
function setField(entries, context, type) {
  const sorted = [...entries].sort((x, y) => byBytes(String(x.value), String(y.value)) || compareStamps(x.stamp, y.stamp));
  return { value: [...new Set(sorted.map((e) => e.value))], type: setType(type),
           crdt: { entries: sorted, context: [...context].sort((x, y) => byBytes(x.replica, y.replica)) } };
}

/** The observed-remove join: an entry stays when both hold it, or the other side never saw its add. */
function joinSets(a, b) {
  const ea = a.crdt.entries, eb = b.crdt.entries, ca = a.crdt.context || [], cb = b.crdt.context || [];
  const kept = ea.filter((e) => eb.some((o) => sameEntry(e, o)) || !covers(cb, e.stamp));
  for (const e of eb) if (!kept.some((k) => sameEntry(k, e)) && !covers(ca, e.stamp)) kept.push(e);
  return setField(kept, joinContexts(ca, cb), a.type || b.type);
}

/**
 * An ASSETID value's identity, its checksum and size (null for any other value). What else its JSON holds is
 * not the value: the server adds a `downloadURL` for each reader, fresh in each answer and valid for an hour,
 * and an edit made here carries the upload's `receipt`.
 */
const assetIdentity = (value) => (value && typeof value === 'object' && !Array.isArray(value) && typeof value.fileChecksum === 'string'
  ? `${value.fileChecksum}|${value.size}` : null);

/**
 * The join of two states of one field: of different kinds, the greater kind; else the kind's own join. On
 * one write of one asset, `b`'s download URL (the later answer) unless it has none.
 */
function joinFields(a, b) {
  if (!a) return b;
  if (!b) return a;
  const ka = fieldKind(a), kb = fieldKind(b);
  if (ka !== kb) return ka > kb ? a : b;
  if (ka === 1) return joinSets(a, b);
  if (ka >= 2) return joinSequences(a, b, joinContexts);
  const order = compareStamps(a.crdt && a.crdt.stamp, b.crdt && b.crdt.stamp);
  if (order !== 0) return order > 0 ? a : b;
  const asset = assetIdentity(a.value);
  if (asset !== null && asset === assetIdentity(b.value)) return b.value.downloadURL || !a.value.downloadURL ? b : a;
  return byBytes(JSON.stringify(a.value ?? null), JSON.stringify(b.value ?? null)) >= 0 ? a : b;
}

/**
 * The join of two states of one record (either may be null), as the server joins them: the higher
 * generation wins whole; within one, a deletion wins over every edit; otherwise the parent and each
 * field are joined. What is not CRDT state (who changed it and when, the change tag) comes from the
 * state modified last.
 */
export function joinRecords(a, b) {
  if (!a || !a.crdt) return b && b.crdt ? b : (b || a);
  if (!b || !b.crdt) return a;
  const ga = a.crdt.generation || 1, gb = b.crdt.generation || 1;
  if (ga !== gb) return ga > gb ? a : b;
  const newer = ((b.modified && b.modified.timestamp) || 0) >= ((a.modified && a.modified.timestamp) || 0) ? b : a;
  const typeFrom = compareStamps(a.crdt.created, b.crdt.created) === 0
    ? (byBytes(a.recordType || '', b.recordType || '') >= 0 ? a : b)
    : (compareStamps(a.crdt.created, b.crdt.created) > 0 ? a : b);
  const result = { ...newer, recordType: typeFrom.recordType, crdt: { generation: ga, created: typeFrom.crdt.created } };
  if (a.crdt.deletion || b.crdt.deletion) {
    result.crdt.deletion = a.crdt.deletion && b.crdt.deletion ? greater(a.crdt.deletion, b.crdt.deletion)
      : (a.crdt.deletion || b.crdt.deletion);
    result.deleted = true;
    result.fields = {};
    delete result.parent;
    return result;
  }
  result.deleted = false;
  const pa = a.crdt.parent, pb = b.crdt.parent;
  if (pa || pb) {
    const winner = !pb || (pa && compareStamps(pa, pb) >= 0) ? a : b;
    result.parent = winner.parent;
    result.crdt.parent = winner.crdt.parent;
  } else {
    delete result.parent;
  }
  const fields = {};
  for (const name of new Set([...Object.keys(a.fields || {}), ...Object.keys(b.fields || {})])) {
    fields[name] = joinFields((a.fields || {})[name], (b.fields || {})[name]);
  }
  result.fields = fields;
  return result;
}

/** The value of a field of a record in JSON form (undefined when absent or cleared). */
export function fieldValue(record, name) {
  const field = record && record.fields && record.fields[name];
  return field && field.value !== null ? field.value : undefined;
}

// MARK: Local edits, as states the server joins (records/modify forceUpdate with `crdt` keys)

/** The part of a state every edit carries: identity, type, generation and creation (and the parent). */
function header(record) {
  const state = { recordName: record.recordName, recordType: record.recordType, zoneID: record.zoneID,
                  crdt: { generation: record.crdt.generation || 1, created: record.crdt.created }, fields: {} };
  // The parent as last seen (joining it changes nothing): a shared list's server places the edit by it.
  if (record.crdt.parent && record.parent) {
    state.parent = { recordName: record.parent.recordName, action: 'NONE' };
    state.crdt.parent = record.crdt.parent;
  }
  return state;
}

/** A state setting scalar fields ({name: [value, type]}) of `record`, stamped now. */
export function setFields(record, clock, values) {
  const state = header(record);
  for (const [name, [value, type]] of Object.entries(values)) {
    state.fields[name] = value === null || value === undefined
      ? { value: null, crdt: { stamp: clock.stamp() } }
      : { value, type, crdt: { stamp: clock.stamp() } };
  }
  return state;
}

/**
 * A state of the field `name` with the elements `add` added and `remove` removed, from what `record` holds,
 * as its kind means: a set (or a missing field, which becomes a set of `type`) adds and removes them
 * (add-wins); a list appends each added element it does not hold and deletes every occurrence of each
 * removed one, and stays a list.
 */
export function editSet(record, clock, name, add, remove, type = 'STRING_SET') {
  const state = header(record);
  const field = (record.fields || {})[name];
  if (fieldKind(field) === 2) {
    let list = field;
    const stamp = clock.stamp();
    for (const element of remove) {
      for (let at = list.value.indexOf(element); at >= 0; at = list.value.indexOf(element)) {
        list = splice(list, stamp, at, 1, [], joinContexts);
      }
    }
    for (const element of add) {
      if (!list.value.includes(element)) list = splice(list, stamp, list.value.length, 0, [element], joinContexts, elementTypeOf(list));
    }
    // An edit that changes nothing still records its stamp, as the server's does.
    state.fields[name] = list === field ? { ...field, crdt: { ...field.crdt, context: joinContexts(field.crdt.context, [stamp]) } } : list;
    return state;
  }
  let entries = isSet(field) ? [...field.crdt.entries] : [];
  let context = isSet(field) ? [...field.crdt.context] : [];
  for (const element of [...remove, ...add]) {
    const stamp = clock.stamp();
    entries = entries.filter((e) => e.value !== element);
    if (add.includes(element)) entries.push({ value: element, stamp });
    context = joinContexts(context, [stamp]);
  }
  state.fields[name] = setField(entries, context, isSet(field) ? field.type : type);
  return state;
}

/** A list's element type ("STRING" of "STRING_LIST"). */
const elementTypeOf = (list) => (list.type || 'STRING_LIST').slice(0, -5);

/**
 * A state of the text field `name` of `record` reading `text`: the splice around the changed middle (common
 * start and end) of the text the record holds, applied to its CRDT state and stamped now, so what others
 * changed elsewhere in the text stays. A field that is not a text yet becomes one (a text is the greatest
 * kind). Returns null when the text is already `text`.
 */
export function editText(record, clock, name, text) {
  const field = (record.fields || {})[name];
  const current = fieldKind(field) === 3 ? field : emptySequence('TEXT');
  const change = textSplice(current.value, text);
  if (!change && current === field) return null;
  const state = header(record);
  const stamp = clock.stamp();
  state.fields[name] = change
    ? splice(current, stamp, change[0], change[1], change[2], joinContexts)
    : { ...current, crdt: { ...current.crdt, context: joinContexts(current.crdt.context, [stamp]) } };
  return state;
}

/**
 * A whole new record (or, over a deleted one, its next generation): `scalars` {name: [value, type]},
 * `sets` {name: [strings]} (STRING_SET), `texts` {name: string} (TEXT; an empty one is left out), under
 * `parent`.
 */
export function newRecord(clock, { recordName, recordType, zoneID, generation = 1, parent, scalars = {}, sets = {}, texts = {} }) {
  const created = clock.stamp();
  const state = { recordName, recordType, zoneID, crdt: { generation, created }, fields: {} };
  if (parent) {
    state.parent = { recordName: parent, action: 'NONE' };
    state.crdt.parent = clock.stamp();
  }
  for (const [name, [value, type]] of Object.entries(scalars)) state.fields[name] = { value, type, crdt: { stamp: clock.stamp() } };
  for (const [name, elements] of Object.entries(sets)) {
    if (!elements.length) continue;
    const stamp = clock.stamp();
    state.fields[name] = setField(elements.map((value) => ({ value, stamp })), [stamp], 'STRING_SET');
  }
  for (const [name, text] of Object.entries(texts)) {
    if (text) state.fields[name] = splice(emptySequence('TEXT'), clock.stamp(), 0, 0, text, joinContexts);
  }
  return state;
}

/** The deletion of this generation of `record` (delete wins over every edit of the generation). */
export function deletion(record, clock) {
  return { recordName: record.recordName, recordType: record.recordType, zoneID: record.zoneID, deleted: true, fields: {},
           crdt: { generation: record.crdt.generation || 1, created: record.crdt.created, deletion: clock.stamp() } };
}
