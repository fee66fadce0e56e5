// Ordered lists and texts in the page: the same sequence join as the server's (Docs/Merge.md §10), on a
// field's JSON form, and the local edits (splices) as new states.
//
// A sequence field is {type, value, crdt: {context, runs}}: `value` is the visible elements in order (a
// string for TEXT, an array for a list), `context` the stamps of its edits (one per replica), and `runs`
// the elements in document order, tombstones included, each run
// [replica, counter, length, parentReplica, parentCounter, deleted]: `length` consecutive elements of one
// replica (counters counter, counter + 1, ...), each the child of the one before, the first the child of
// (parentReplica, parentCounter), or of the start when those are null. The document is the pre-order walk
// of that tree with children in descending id order (counter, then replica).

/** Compares element ids: counter, then replica (16 hex digits, so text order is number order). */
const compareIDs = (a, b) => (a.c - b.c) || (a.r < b.r ? -1 : a.r > b.r ? 1 : 0);
const key = (r, c) => `${r}:${c}`;

/** True for a list or text field's JSON form. */
export const isSequence = (field) => !!(field && field.crdt && Array.isArray(field.crdt.runs));

/** A text's characters: Unicode scalars, as the server counts positions. */
const scalars = (text) => Array.from(text || '');

/** Every element of a sequence field in document order: {r, c, p (parent key or null), d, v}. */
export function elementsOf(field) {
  const values = field.type === 'TEXT' ? scalars(field.value) : [...(field.value || [])];
  const elements = [];
  let next = 0;
  for (const [r, c, length, pr, pc, deleted] of field.crdt.runs) {
    for (let offset = 0; offset < length; offset++) {
      const parent = offset > 0 ? key(r, c + offset - 1) : (pr === null ? null : key(pr, pc));
      elements.push({ r, c: c + offset, p: parent, d: !!deleted, v: deleted ? undefined : values[next++] });
    }
  }
  return elements;
}

/** A sequence field from elements in document order: runs merged where one continues another. */
export function sequenceField(elements, context, type) {
  const runs = [];
  const values = [];
  let last = null;
  for (const e of elements) {
    const continues = last && last[0] === e.r && last[1] + last[2] === e.c && !!last[5] === e.d
      && e.p === key(e.r, e.c - 1);
    if (continues) {
      last[2] += 1;
    } else {
      const [pr, pc] = e.p === null ? [null, null] : [e.p.slice(0, e.p.indexOf(':')), Number(e.p.slice(e.p.indexOf(':') + 1))];
      last = [e.r, e.c, 1, pr, pc, e.d ? 1 : 0];
      runs.push(last);
    }
    if (!e.d) values.push(e.v);
  }
  return { type, value: type === 'TEXT' ? values.join('') : values, crdt: { context, runs } };
}

/** The elements in the tree's order: pre-order, each element's children newest (greatest id) first. */
function treeOrder(byKey) {
  const children = new Map();
  for (const e of byKey.values()) {
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
  return ordered;
}

/** The join: every element of either side, deleted when either side deleted it, in the tree's order. */
export function joinSequences(a, b, joinContexts) {
  const byKey = new Map();
  for (const e of elementsOf(a)) byKey.set(key(e.r, e.c), e);
  for (const e of elementsOf(b)) {
    const known = byKey.get(key(e.r, e.c));
    if (!known) byKey.set(key(e.r, e.c), e);
    else if (e.d && !known.d) byKey.set(key(e.r, e.c), { ...known, d: true, v: undefined });
  }
  return sequenceField(treeOrder(byKey), joinContexts(a.crdt.context || [], b.crdt.context || []), a.type || b.type);
}

/** An empty sequence field of `type` (TEXT or a T_LIST). */
export const emptySequence = (type) => ({ type, value: type === 'TEXT' ? '' : [], crdt: { context: [], runs: [] } });

/**
 * At visible `position`, deletes `deleteCount` elements and inserts `inserted` (an array, or a string for
 * a text), stamped by `clock`: the new elements take the counters after the greatest in the field and hang
 * after the visible element before `position`. Returns the new field.
 */
export function splice(field, clock, position, deleteCount, inserted, joinContexts) {
  const elements = elementsOf(field);
  const items = typeof inserted === 'string' ? scalars(inserted) : [...(inserted || [])];
  const visible = [];
  elements.forEach((e, index) => { if (!e.d) visible.push(index); });
  if (position < 0 || deleteCount < 0 || position + deleteCount > visible.length) throw new RangeError('splice past the end');
  if (deleteCount === 0 && items.length === 0) return field;
  const stamp = clock.stamp();
  for (let i = position; i < position + deleteCount; i++) {
    elements[visible[i]] = { ...elements[visible[i]], d: true, v: undefined };
  }
  if (items.length) {
    let greatest = 0;
    for (const e of elements) greatest = Math.max(greatest, e.c);
    const before = position > 0 ? elements[visible[position - 1]] : null;
    let parent = before ? key(before.r, before.c) : null;
    const added = items.map((v, offset) => {
      const e = { r: clock.replica, c: greatest + 1 + offset, p: parent, d: false, v };
      parent = key(e.r, e.c);
      return e;
    });
    // Right after the parent: the newest child comes first.
    const at = before ? visible[position - 1] + 1 : 0;
    elements.splice(at, 0, ...added);
  }
  return sequenceField(elements, joinContexts(field.crdt.context || [], [stamp]), field.type);
}

/** Turns a text into `text` with one splice around the changed middle (what one input event changes). */
export function editText(field, clock, text, joinContexts) {
  const old = scalars(field.value), now = scalars(text);
  let start = 0;
  while (start < old.length && start < now.length && old[start] === now[start]) start++;
  let end = 0;
  while (end < old.length - start && end < now.length - start
    && old[old.length - 1 - end] === now[now.length - 1 - end]) end++;
  return splice(field, clock, start, old.length - start - end, now.slice(start, now.length - end).join(''), joinContexts);
}
