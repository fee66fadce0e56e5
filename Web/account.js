// The account page: passkeys (add on this device, rename, remove) and recovery codes (how many are left,
// a new set). Every call is an account route with the session's CSRF value (Api.post). User text goes on
// screen with textContent only.
import { Api, currentSession } from './api.js';
import { passkeysSupported, createPasskey, passkeyProblem, showRecoveryCodes } from './passkeys.js';

const $ = (id) => document.getElementById(id);
let api = null;

function say(text, isError = false) {
  $('status').textContent = text;
  $('status').className = isError ? 'error' : '';
}

const when = (timestamp) => (timestamp ? new Date(timestamp.timestamp).toLocaleString() : '');

function button(id, text, label, className = 'button small secondary') {
  const node = document.createElement('button');
  node.type = 'button';
  node.id = id;
  node.className = className;
  node.textContent = text;
  node.setAttribute('aria-label', label);
  return node;
}

function show(answer) {
  const list = $('passkeys');
  list.replaceChildren();
  const passkeys = answer.passkeys || [];
  $('no-passkeys').hidden = passkeys.length > 0;
  passkeys.forEach((passkey, index) => {
    const row = document.createElement('li');
    const name = document.createElement('span');
    name.dir = 'auto';
    name.textContent = passkey.name;
    const meta = document.createElement('span');
    meta.className = 'meta';
    meta.textContent = `added ${when(passkey.created)}` + (passkey.lastUsed ? `, last used ${when(passkey.lastUsed)}` : ', not used yet');
    const rename = button(`rename-${index}`, 'Rename', `Rename passkey ${passkey.name}`);
    rename.addEventListener('click', () => renameForm(row, passkey, rename));
    const remove = button(`remove-${index}`, 'Remove', `Remove passkey ${passkey.name}`, 'button small danger');
    remove.addEventListener('click', async () => {
      if (remove.dataset.confirm !== 'yes') {
        remove.dataset.confirm = 'yes';
        remove.textContent = passkeys.length === 1
          ? `Remove your last passkey? (${answer.recoveryCodesLeft} recovery codes left) Press again`
          : 'Remove: press again';
        return;
      }
      try {
        show(await api.post('/auth/passkeys/delete', { passkeyID: passkey.passkeyID }));
        say(`Removed the passkey ${passkey.name}.`);
        $('passkeys-section').focus();
      } catch (error) { say(error.reason, true); }
    });
    row.append(name, meta, rename, remove);
    list.append(row);
  });
  const left = answer.recoveryCodesLeft;
  $('codes-left').textContent = left === 1 ? '1 unused recovery code.' : `${left} unused recovery codes.`;
}

function renameForm(row, passkey, opener) {
  const form = document.createElement('form');
  form.className = 'inline';
  const label = document.createElement('label');
  label.htmlFor = 'rename-field';
  label.textContent = `New name for ${passkey.name}`;
  const field = document.createElement('input');
  field.id = 'rename-field';
  field.required = true;
  field.maxLength = 64;
  field.dir = 'auto';
  field.value = passkey.name;
  const save = button('rename-save', 'Save', `Save the new name of ${passkey.name}`, 'button small');
  save.type = 'submit';
  form.append(label, field, save);
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    try {
      show(await api.post('/auth/passkeys/rename', { passkeyID: passkey.passkeyID, name: field.value.trim() }));
      say('Renamed.');
    } catch (error) { say(error.reason, true); }
  });
  form.addEventListener('keydown', (event) => { if (event.key === 'Escape') { form.remove(); opener.focus(); } });
  row.append(form);
  field.focus();
}

async function addPasskey() {
  say('Making a passkey…');
  try {
    const options = await api.post('/auth/passkey/register/options', {});
    const credential = await createPasskey(options);
    const device = /Android|iPhone|iPad/.test(navigator.userAgent) ? 'Phone' : 'This computer';
    await api.post('/auth/passkey/register', { credential, name: device });
    show(await api.post('/auth/passkeys/list', {}));
    say(`Added a passkey named “${device}”; rename it if you like.`);
  } catch (error) {
    say(passkeyProblem(error), true);
  }
}

async function newCodes() {
  const opener = $('new-codes');
  if (opener.dataset.confirm !== 'yes') {
    opener.dataset.confirm = 'yes';
    opener.textContent = 'Make new codes: the old ones stop working. Press again';
    return;
  }
  opener.dataset.confirm = '';
  opener.textContent = 'Make new recovery codes';
  try {
    const { recoveryCodes } = await api.post('/auth/recovery/codes', {});
    opener.hidden = true;
    await showRecoveryCodes($('codes-place'), recoveryCodes);
    opener.hidden = false;
    show(await api.post('/auth/passkeys/list', {}));
    $('codes-section').focus();
  } catch (error) { say(error.reason, true); }
}

async function start() {
  const session = await currentSession().catch(() => null);
  if (!session) { $('signed-out').hidden = false; return; }
  api = new Api(session);
  $('who').textContent = session.name;
  for (const id of ['passkeys-section', 'codes-section', 'devices-section']) $(id).hidden = false;
  if (passkeysSupported()) $('add-passkey').addEventListener('click', addPasskey);
  else { $('add-passkey').hidden = true; $('no-webauthn').hidden = false; }
  $('new-codes').addEventListener('click', newCodes);
  show(await api.post('/auth/passkeys/list', {}));
  document.body.dataset.ready = 'true';
}

start().catch((error) => say(error.reason || error.message, true));
