// Devices and sign-ins: approve a new device's user code (the device flow, POST /auth/device/approve) and
// see or sign out the account's devices, browser sessions and tokens (tokens/list, tokens/revoke).
// User text goes on screen with textContent only.
import { Api, ApiError, currentSession } from './api.js';

const $ = (id) => document.getElementById(id);
let api = null;

function say(text, isError = false) {
  $('status').textContent = text;
  $('status').className = isError ? 'error' : '';
}

/** POST to a path outside /database/ with the session's CSRF value. */
async function post(path, body) {
  const response = await fetch(path, {
    method: 'POST', credentials: 'same-origin',
    headers: { 'Content-Type': 'application/json', 'X-Lattice-CSRF': api.session.csrfToken },
    body: JSON.stringify(body),
  });
  let json = {};
  try { json = await response.json(); } catch (_) { json = {}; }
  if (!response.ok) throw new ApiError(json.serverErrorCode, json.reason, response.status, json);
  return json;
}

const KINDS = { session: 'Browser', device: 'Device', bearer: 'Token', signInLink: 'Sign-in link' };

function when(timestamp) {
  return timestamp ? new Date(timestamp.timestamp).toLocaleString() : '';
}

async function showTokens() {
  const { tokens = [] } = await api.call('private', 'tokens/list', {});
  const list = $('tokens');
  list.replaceChildren();
  for (const token of tokens.filter((t) => !t.expired)) {
    const row = document.createElement('li');
    row.id = 'token-' + token.tokenID;
    const name = document.createElement('span');
    name.dir = 'auto';
    const kind = KINDS[token.kind] || 'Token';
    const label = token.deviceName ? `${kind}: ${token.deviceName}` : kind;
    name.textContent = token.current ? `${label} (this browser)` : label;
    const meta = document.createElement('span');
    meta.className = 'meta';
    meta.textContent = `since ${when(token.created)}` + (token.expires ? `, until ${when(token.expires)}` : '');
    row.append(name, meta);
    if (!token.current) {
      const revoke = document.createElement('button');
      revoke.type = 'button';
      revoke.className = 'button small danger';
      revoke.id = 'revoke-' + token.tokenID;
      revoke.textContent = 'Sign out';
      revoke.setAttribute('aria-label', `Sign out ${label}, since ${when(token.created)}`);
      revoke.addEventListener('click', async () => {
        if (revoke.dataset.confirm !== 'yes') {
          revoke.dataset.confirm = 'yes';
          revoke.textContent = 'Sign out: sure?';
          return;
        }
        try {
          await api.call('private', 'tokens/revoke', { tokens: [{ tokenID: token.tokenID }] });
          say(`Signed out ${label}.`);
          await showTokens();
          $('list-section').focus();
        } catch (error) {
          say(error.reason, true);
        }
      });
      row.append(revoke);
    }
    list.append(row);
  }
}

async function decide(deny) {
  const code = $('user-code').value.trim();
  if (!code) { say('Type the code the new device shows.', true); $('user-code').focus(); return; }
  const body = { userCode: code };
  const name = $('device-name').value.trim();
  if (name && !deny) body.deviceName = name;
  if (deny) body.deny = true;
  say(deny ? 'Denying…' : 'Approving…');
  try {
    const answer = await post('/auth/device/approve', body);
    say(answer.approved
      ? `Approved ${answer.deviceName || 'the device'}: it is signing in now.`
      : `Denied: the device with code ${answer.userCode} was not let in.`);
    $('user-code').value = '';
    $('device-name').value = '';
    await showTokens();
    // The device gets its token on its next poll (every few seconds): list it when it has (bounded).
    if (answer.approved) {
      for (let tries = 0; tries < 15; tries++) {
        await new Promise((resolve) => setTimeout(resolve, 2000));
        const { tokens = [] } = await api.call('private', 'tokens/list', {});
        if (tokens.some((t) => t.kind === 'device' && t.deviceName === answer.deviceName)) { await showTokens(); break; }
      }
    }
  } catch (error) {
    say(error.reason, true);
  }
}

async function start() {
  $('list-section').tabIndex = -1; // a focus target after a sign-out, named by its heading
  const session = await currentSession().catch(() => null);
  if (!session) { $('signed-out').hidden = false; return; }
  api = new Api(session);
  $('who').textContent = session.name;
  $('server-url').textContent = location.origin;
  $('add-section').hidden = false;
  $('list-section').hidden = false;
  $('approve-form').addEventListener('submit', (event) => { event.preventDefault(); decide(false); });
  $('deny').addEventListener('click', () => decide(true));
  await showTokens().catch((error) => say(error.reason, true));
  document.body.dataset.ready = 'true';
}

start();
