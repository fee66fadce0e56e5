// Ordered lists and texts in the page: the server's sequence (Docs/Merge.md §10) on a field's JSON form:
// its join, local edits (splices) as new states, and where a caret goes when the text changes under it.
//
// A sequence field is {type, value, crdt: {context, runs, types?}}: `type` is TEXT or a T_LIST, `value`
// the visible elements in order (a string for a text, an array for a list), `context` the stamps of its
// edits (a version vector, one stamp per replica), and `runs` every element in document order, tombstones
// included, as [replica, counter, length, parentReplica, parentCounter, deleted]: `length` elements of one
// replica with counters counter, counter + 1, ..., each the child of the one before, the first the child of
// (parentReplica, parentCounter), or of the start when those are null; all visible, or all deleted (a
// tombstone keeps its id, parent and place, never its value). A list whose elements are not all of the first
// one's type says each visible element's type in `crdt.types`.
//
// An element's id is (counter, replica), ordered by counter, then replica. The document is the pre-order
// walk of the tree of parents with each element's children in descending id order (RGA). A new element
// takes the counter after the greatest in the sequence, so it lands right after its parent.

/** The largest counter a sequence may use (the server's `SequenceState.maximumCounter`, 2^48 - 1). */
const MAXIMUM_COUNTER = 2 ** 48 - 1;
const HEX16 = /^[0-9a-f]{16}$/;

/** Compares element ids: counter, then replica (16 lower-case hex digits, so text order is number order). */
const compareIDs = (a, b) => (a.c - b.c) || (a.r < b.r ? -1 : a.r > b.r ? 1 : 0);
const key = (r, c) => `${r}:${c}`;
const isCounter = (n) => Number.isInteger(n) && n >= 1 && n <= MAXIMUM_COUNTER;

/** True for a list or text field's JSON form (its CRDT holds runs). */
export const isSequence = (field) => !!(field && field.crdt && Array.isArray(field.crdt.runs));

/** True for a text field's JSON form. */
export const isText = (field) => isSequence(field) && field.type === 'TEXT';

/** A text's characters: Unicode scalars, as the server counts positions. */
export const scalars = (text) => Array.from(text || '');

/** The element type of a list type ("STRING" of "STRING_LIST"). */
const elementType = (type) => (typeof type === 'string' && type.endsWith('_LIST') ? type.slice(0, -5) : null);

/** A field's JSON form that is not a sequence, said as such (the page never makes one, so the server sent it). */
function malformed(field, message) {
  return new TypeError(`a list or text field ${message}: ${JSON.stringify(field).slice(0, 200)}`);
}

/**
 * Every element of a sequence field in document order: {r, c, p (the parent's key, or null), d (deleted),
 * v (the value, undefined for a tombstone), t (a list element's type)}. Throws a TypeError naming what is
 * wrong when the field is not a well-formed sequence.
 */
export function elementsOf(field) {
  if (!isSequence(field)) throw malformed(field, 'has no runs');
  const text = field.type === 'TEXT';
  const listType = elementType(field.type);
  if (!text && !listType) throw malformed(field, 'has type TEXT or a T_LIST');
  if (text ? typeof field.value !== 'string' : !Array.isArray(field.value)) throw malformed(field, 'has no value of its type');
  const values = text ? scalars(field.value) : field.value;
  const types = !text && Array.isArray(field.crdt.types) ? field.crdt.types : null;
  if (types && types.length !== values.length) throw malformed(field, 'has one type per value');
  const elements = [];
  let next = 0;
  field.crdt.runs.forEach((run, index) => {
    const [r, c, length, pr, pc, deleted] = Array.isArray(run) ? run : [];
    const parentOK = (pr === null && pc === null) || (typeof pr === 'string' && HEX16.test(pr) && isCounter(pc));
    if (!Array.isArray(run) || run.length !== 6 || typeof r !== 'string' || !HEX16.test(r) || !isCounter(c)
        || !Number.isInteger(length) || length < 1 || c + length - 1 > MAXIMUM_COUNTER || !parentOK || (deleted !== 0 && deleted !== 1)) {
      throw malformed(field, `has runs [replica, counter, length, parentReplica, parentCounter, deleted] (runs[${index}])`);
    }
    for (let offset = 0; offset < length; offset++) {
      const parent = offset > 0 ? key(r, c + offset - 1) : (pr === null ? null : key(pr, pc));
      const e = { r, c: c + offset, p: parent, d: deleted === 1, v: undefined, t: undefined };
      if (!e.d) {
        if (next >= values.length) throw malformed(field, 'holds as many values as visible elements');
        e.v = values[next];
        if (!text) e.t = types ? types[next] : listType;
        next += 1;
      }
      elements.push(e);
    }
  });
  if (next !== values.length) throw malformed(field, 'holds as many values as visible elements');
  return elements;
}

/**
 * A sequence field from elements in document order, with runs merged where one continues another (as the
 * server writes them, and requires). A list's type is its first element's (STRING_LIST when empty), with
 * `crdt.types` when the elements' types differ, as the server says it.
 */
export function sequenceField(elements, context, text) {
  const runs = [];
  const values = [];
  const types = [];
  let last = null;
  for (const e of elements) {
    const continues = last && last[0] === e.r && last[1] + last[2] === e.c && last[5] === (e.d ? 1 : 0)
      && e.p === key(e.r, e.c - 1);
    if (continues) {
      last[2] += 1;
    } else {
      const split = e.p === null ? -1 : e.p.indexOf(':');
      last = [e.r, e.c, 1, e.p === null ? null : e.p.slice(0, split), e.p === null ? null : Number(e.p.slice(split + 1)), e.d ? 1 : 0];
      runs.push(last);
    }
    if (!e.d) { values.push(e.v); types.push(e.t); }
  }
  if (text) return { type: 'TEXT', value: values.join(''), crdt: { context, runs } };
  const type = types.length ? types[0] : 'STRING';
  const crdt = { context, runs };
  if (types.some((t) => t !== type)) crdt.types = types;
  return { type: type + '_LIST', value: values, crdt };
}

/** The elements in the tree's order: pre-order, each element's children newest (greatest id) first. */
function treeOrder(elements) {
  const children = new Map();
  for (const e of elements) {
    const list = children.get(e.p);
    if (list) list.push(e); else children.set(e.p, [e]);
  }
  for (const list of children.values()) list.sort((x, y) => compareIDs(y, x));
  const ordered = [];
  const stack = [...(children.get(null) || [])].reverse();
  while (stack.length) {
    const e = stack.pop();
    ordered.push(e);
    const below = children.get(key(e.r, e.c));
    if (below) for (let i = below.length - 1; i >= 0; i--) stack.push(below[i]);
  }
  // An element whose parent is missing (only a malformed state has one) is never reached: left out, as the
  // server's join leaves it out.
  return ordered;
}

/**
 * The join of two states of one list or text: every element of either side, deleted when either side
 * deleted it, in the tree's order; the contexts joined by `joinContexts`. Commutative, associative and
 * idempotent, as the server's.
 */
export function joinSequences(a, b, joinContexts) {
  const text = a.type === 'TEXT';
  const context = joinContexts(a.crdt.context || [], b.crdt.context || []);
  const byKey = new Map();
  for (const e of elementsOf(a)) byKey.set(key(e.r, e.c), e);
  let added = false;
  for (const e of elementsOf(b)) {
    const k = key(e.r, e.c);
    const known = byKey.get(k);
    if (!known) { byKey.set(k, e); added = true; } else if (e.d && !known.d) byKey.set(k, { ...known, d: true, v: undefined, t: undefined });
  }
  // Nothing new from `b` and nothing deleted by it: `a`'s order stands (a state is always in tree order).
  const order = added ? treeOrder([...byKey.values()]) : elementsOf(a).map((e) => byKey.get(key(e.r, e.c)));
  return sequenceField(order, context, text);
}

/** An empty text (`TEXT`) or list (`T_LIST`) field. */
export const emptySequence = (type) => (type === 'TEXT'
  ? { type, value: '', crdt: { context: [], runs: [] } }
  : { type, value: [], crdt: { context: [], runs: [] } });

/**
 * At visible `position`, deletes `deleteCount` elements and inserts `inserted` (a string for a text, an array
 * for a list, whose elements are of `type`, say STRING), as one edit stamped `stamp`: the new elements take
 * the counters after the greatest in the field, the first hangs after the visible element before `position`
 * (the start at 0), each next one after the one before. Returns the new field; throws a RangeError for a
 * position past the end.
 */
export function splice(field, stamp, position, deleteCount, inserted, joinContexts, type = 'STRING') {
  const text = field.type === 'TEXT';
  const elements = elementsOf(field);
  const items = text ? scalars(inserted) : [...(inserted || [])];
  const visible = [];
  elements.forEach((e, index) => { if (!e.d) visible.push(index); });
  if (!Number.isInteger(position) || !Number.isInteger(deleteCount) || position < 0 || deleteCount < 0
      || position + deleteCount > visible.length) {
    throw new RangeError(`splice at ${position} deleting ${deleteCount}: past the end (${visible.length} elements)`);
  }
  for (let i = position; i < position + deleteCount; i++) {
    elements[visible[i]] = { ...elements[visible[i]], d: true, v: undefined, t: undefined };
  }
  if (items.length) {
    let greatest = 0;
    for (const e of elements) greatest = Math.max(greatest, e.c);
    if (greatest + items.length > MAXIMUM_COUNTER) throw new RangeError('the sequence has used every counter');
    const before = position > 0 ? elements[visible[position - 1]] : null;
    let parent = before ? key(before.r, before.c) : null;
    const added = items.map((v, offset) => {
      const e = { r: stamp.replica, c: greatest + 1 + offset, p: parent, d: false, v, t: text ? undefined : type };
      parent = key(e.r, e.c);
      return e;
    });
    // The newest child of its parent: right after the parent (first of all at the start).
    elements.splice(before ? visible[position - 1] + 1 : 0, 0, ...added);
  }
  return sequenceField(elements, joinContexts(field.crdt.context || [], [stamp]), text);
}

/**
 * The one splice [position, deleteCount, inserted] that turns text `from` into `to` around their common
 * start and end (what one input event changes), in Unicode scalars; null when they are equal.
 */
export function textSplice(from, to) {
  const old = scalars(from), now = scalars(to);
  let start = 0;
  while (start < old.length && start < now.length && old[start] === now[start]) start++;
  let end = 0;
  while (end < old.length - start && end < now.length - start && old[old.length - 1 - end] === now[now.length - 1 - end]) end++;
  if (start === old.length && start === now.length) return null;
  return [start, old.length - start - end, now.slice(start, now.length - end).join('')];
}

/**
 * Where a caret at visible `position` of a text is, as the id of the element before it (null at the
 * start): `positionAfter` finds it again in a later state of the text, whatever was inserted or deleted.
 */
export function anchorAt(field, position) {
  if (!isSequence(field) || position <= 0) return null;
  let seen = 0;
  for (const e of elementsOf(field)) {
    if (e.d) continue;
    seen += 1;
    if (seen === position) return key(e.r, e.c);
  }
  return null;
}

/**
 * The visible position right after the element `anchor` (anchorAt) in `field`: after it when it is still
 * visible, where it was when it was deleted; 0 for the start, null when the field does not hold it.
 */
export function positionAfter(field, anchor) {
  if (anchor === null) return 0;
  if (!isSequence(field)) return null;
  let seen = 0;
  for (const e of elementsOf(field)) {
    if (!e.d) seen += 1;
    if (key(e.r, e.c) === anchor) return seen;
  }
  return null;
}
