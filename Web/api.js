// The HTTP API as the pages use it: the session cookie (HttpOnly, sent by the browser) plus the
// session's CSRF value in X-Lattice-CSRF on every request. No other origin is ever contacted.

export class ApiError extends Error {
  constructor(code, reason, status, body = {}) {
    super(reason || code || `HTTP ${status}`);
    this.code = code || 'HTTP_' + status;
    this.reason = reason || `the server answered ${status}`;
    this.status = status;
    /** The whole error object the server answered (a refused account switch names both accounts). */
    this.body = body;
  }
}

async function answer(response) {
  let json = {};
  try { json = await response.json(); } catch (_) { json = {}; }
  if (!response.ok) throw new ApiError(json.serverErrorCode, json.reason, response.status, json);
  return json;
}

/** The signed-in session ({name, userRecordName, csrfToken, container, environment}), or null. */
export async function currentSession() {
  const response = await fetch('/auth/session', { credentials: 'same-origin', headers: { Accept: 'application/json' } });
  if (response.status === 421 || response.status === 401) return null;
  return answer(response);
}

/** Requests that make a session carry X-Lattice-CSRF (any value) and come from this origin. */
export async function postWithoutSession(path, body) {
  return answer(await fetch(path, {
    method: 'POST', credentials: 'same-origin',
    headers: { 'Content-Type': 'application/json', 'X-Lattice-CSRF': 'new-session' },
    body: JSON.stringify(body),
  }));
}

export function signUp(name) { return postWithoutSession('/auth/signup', { name, session: true }); }
/**
 * Exchanges a one-time sign-in link for a session. A browser signed in to another account is refused
 * (CONFLICT, naming `signedInAs` and `linkAccount`; the link stays unspent) unless `replaceSession` is
 * true, which only the person's "Switch to …" choice sends (signinlink.js).
 */
export function exchangeSignInLink(secret, replaceSession = false) {
  return postWithoutSession('/auth/link', replaceSession ? { secret, replaceSession: true } : { secret });
}

export class Api {
  constructor(session) {
    this.session = session;
    this.base = `/database/1/${encodeURIComponent(session.container)}/${encodeURIComponent(session.environment)}/`;
  }

  async call(database, operation, body = {}, signal = undefined) {
    return this.send(database, operation, JSON.stringify(body), signal);
  }

  /** A database request with the body as given, byte for byte (a retried clientOperationID needs that). */
  async send(database, operation, body, signal = undefined) {
    return answer(await fetch(this.base + database + '/' + operation, {
      method: 'POST', credentials: 'same-origin', signal,
      headers: { 'Content-Type': 'application/json', 'X-Lattice-CSRF': this.session.csrfToken || '' },
      body,
    }));
  }

  /** A POST to an account route outside /database/ (`/auth/passkeys/list`, say), with the CSRF value. */
  async post(path, body = {}) {
    return answer(await fetch(path, {
      method: 'POST', credentials: 'same-origin',
      headers: { 'Content-Type': 'application/json', 'X-Lattice-CSRF': this.session.csrfToken },
      body: JSON.stringify(body),
    }));
  }

  async signOut() {
    return answer(await fetch('/auth/signout', {
      method: 'POST', credentials: 'same-origin',
      headers: { 'Content-Type': 'application/json', 'X-Lattice-CSRF': this.session.csrfToken }, body: '{}',
    }));
  }
}

/**
 * Sends a file's bytes to an upload URL that `assets/upload` answered (the URL is the credential: no cookie
 * or CSRF value is needed), with the file's type, and resolves to the asset dictionary the server answers
 * (`singleFile`: `fileChecksum`, `size`, `receipt`), which a record's ASSETID field then takes.
 * The browser streams the File from disk: its bytes are never read into script memory. XMLHttpRequest
 * rather than fetch, because only it reports the bytes sent: `progress(sent, total)` as they leave. Only
 * the URL's path is used, so the request stays on this origin (CSP `connect-src 'self'`) whatever public
 * URL the server names. A lost connection rejects with status 0 (`isUnreachable`).
 */
export function uploadFile(url, file, progress = () => {}) {
  return new Promise((resolve, reject) => {
    const target = new URL(url, location.href);
    const request = new XMLHttpRequest();
    request.open('POST', target.pathname + target.search);
    request.setRequestHeader('Content-Type', file.type || 'application/octet-stream');
    request.responseType = 'json';
    request.upload.onprogress = (event) => progress(event.loaded, event.lengthComputable ? event.total : file.size);
    request.onload = () => {
      const json = request.response || {};
      if (request.status >= 200 && request.status < 300 && json.singleFile) resolve(json.singleFile);
      else reject(new ApiError(json.serverErrorCode, json.reason, request.status, json));
    };
    request.onerror = () => reject(new ApiError(null, 'the connection broke while the photo was sent', 0));
    request.onabort = () => reject(new ApiError(null, 'the upload was cancelled', 0));
    request.send(file);
  });
}

/**
 * A download URL of a record's asset as this page uses it: CloudKit's `${f}` placeholder replaced by the
 * file name wanted (which the answer's Content-Disposition carries back), and only the path, so it loads
 * from this origin (CSP `img-src 'self'`).
 */
export function downloadPath(downloadURL, fileName) {
  const target = new URL(downloadURL.split('${f}').join(encodeURIComponent(fileName)), location.href);
  return target.pathname + target.search;
}

/** The part of location.hash after `key=`, up to the next `&`, or null. */
export function hashValue(key) {
  for (const part of location.hash.replace(/^#/, '').split('&')) {
    if (part.startsWith(key + '=')) return decodeURIComponent(part.slice(key.length + 1));
    if (part === key) return '';
  }
  return null;
}

/**
 * A `next` page to go to after signing in: only a relative path to one of this server's share pages
 * (`/share/` and a token), never another origin (`//host`, `https:`), a scheme or a dot segment.
 */
export function safeNext(value) {
  if (typeof value !== 'string') return null;
  return /^\/share\/[A-Za-z0-9_-][A-Za-z0-9._~-]*$/.test(value) ? value : null;
}

// The page to come back to is kept in localStorage (this origin only) for as long as a sign-in link
// works, so a link opened in another tab, or typed into this one, comes back to the share page too.
const NEXT_KEY = 'lattice.next';
const NEXT_LIFETIME_MS = 10 * 60 * 1000;
const SIGNED_IN_KEY = 'lattice.signedIn';

/** Remembers a share page to come back to after signing in (anything else is ignored). */
export function rememberNext(value) {
  const next = safeNext(value);
  if (next) localStorage.setItem(NEXT_KEY, JSON.stringify({ path: next, until: Date.now() + NEXT_LIFETIME_MS }));
}

/** The remembered share page, if it is still fresh and safe, without forgetting it; else null. */
export function peekNext() {
  const stored = localStorage.getItem(NEXT_KEY);
  try {
    const { path, until } = JSON.parse(stored || 'null') || {};
    return typeof until === 'number' && until > Date.now() ? safeNext(path) : null;
  } catch (_) {
    return null;
  }
}

/** The remembered share page, once (it is forgotten here), if it is still fresh and safe; else null. */
export function takeNext() {
  const stored = localStorage.getItem(NEXT_KEY);
  localStorage.removeItem(NEXT_KEY);
  try {
    const { path, until } = JSON.parse(stored || 'null') || {};
    return typeof until === 'number' && until > Date.now() ? safeNext(path) : null;
  } catch (_) {
    return null;
  }
}

/** Tells this origin's other tabs that this browser just signed in (they reload: `onSignedIn`). */
export function announceSignIn() { localStorage.setItem(SIGNED_IN_KEY, String(Date.now())); }

/** Calls `action` when another tab of this origin signs in. */
export function onSignedIn(action) {
  window.addEventListener('storage', (event) => { if (event.key === SIGNED_IN_KEY) action(); });
}
