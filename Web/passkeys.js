// Passkeys (WebAuthn) and recovery codes in the browser: the ceremonies' JSON to and from the
// authenticator, and the one-time display of recovery codes. The server checks everything (Docs/API.md,
// "Passkeys and recovery codes"); this module only carries bytes. User text goes on screen with textContent.

/** Whether this browser can make and use passkeys here (a secure context with WebAuthn). */
export function passkeysSupported() {
  return Boolean(window.isSecureContext && window.PublicKeyCredential && navigator.credentials);
}

function fromBase64URL(text) {
  const binary = atob(text.replace(/-/g, '+').replace(/_/g, '/') + '==='.slice((text.length + 3) % 4));
  return Uint8Array.from(binary, (c) => c.charCodeAt(0));
}

function toBase64URL(buffer) {
  let binary = '';
  for (const byte of new Uint8Array(buffer)) binary += String.fromCharCode(byte);
  return btoa(binary).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

function creationOptions(json) {
  if (PublicKeyCredential.parseCreationOptionsFromJSON) return PublicKeyCredential.parseCreationOptionsFromJSON(json);
  return {
    ...json,
    challenge: fromBase64URL(json.challenge),
    user: { ...json.user, id: fromBase64URL(json.user.id) },
    excludeCredentials: (json.excludeCredentials || []).map((c) => ({ ...c, id: fromBase64URL(c.id) })),
  };
}

function requestOptions(json) {
  if (PublicKeyCredential.parseRequestOptionsFromJSON) return PublicKeyCredential.parseRequestOptionsFromJSON(json);
  return {
    ...json,
    challenge: fromBase64URL(json.challenge),
    allowCredentials: (json.allowCredentials || []).map((c) => ({ ...c, id: fromBase64URL(c.id) })),
  };
}

function credentialJSON(credential) {
  if (typeof credential.toJSON === 'function') return credential.toJSON();
  const response = {};
  for (const key of ['clientDataJSON', 'attestationObject', 'authenticatorData', 'signature', 'userHandle']) {
    if (credential.response[key]) response[key] = toBase64URL(credential.response[key]);
  }
  return { id: credential.id, rawId: toBase64URL(credential.rawId), type: credential.type, response };
}

/** Makes a passkey with the server's creation options; resolves to the credential's JSON for the server. */
export async function createPasskey(options) {
  return credentialJSON(await navigator.credentials.create({ publicKey: creationOptions(options) }));
}

/** Signs the server's challenge with a passkey the person picks; resolves to the assertion's JSON. */
export async function usePasskey(options) {
  return credentialJSON(await navigator.credentials.get({ publicKey: requestOptions(options) }));
}

/** What to tell a person when the browser's passkey dialog ends without a passkey. */
export function passkeyProblem(error) {
  if (error && error.name === 'NotAllowedError') return 'No passkey was used (the request was cancelled or timed out).';
  if (error && error.name === 'InvalidStateError') return 'This device already has a passkey for this account.';
  return (error && (error.reason || error.message)) || 'The passkey did not work.';
}

/**
 * Shows recovery codes once, in `place`, with Copy and Download, and a Continue button that works once the
 * person says they saved them. Resolves when they continue.
 */
export function showRecoveryCodes(place, codes) {
  return new Promise((resolve) => {
    const section = document.createElement('section');
    section.id = 'recovery-codes';
    section.className = 'recovery-codes';
    section.setAttribute('aria-labelledby', 'recovery-heading');
    const heading = document.createElement('h2');
    heading.id = 'recovery-heading';
    section.tabIndex = -1; // the focus goes to the section, named by its heading
    heading.textContent = 'Save your recovery codes';
    const help = document.createElement('p');
    help.textContent = 'If you lose every device you sign in with, each of these codes signs you in once. '
      + 'Keep them somewhere safe, like a password manager or a printed page. They are shown only now.';
    const list = document.createElement('ol');
    list.id = 'recovery-code-list';
    list.className = 'codes';
    for (const code of codes) {
      const item = document.createElement('li');
      const text = document.createElement('code');
      text.textContent = code;
      item.append(text);
      list.append(item);
    }
    const actions = document.createElement('div');
    actions.className = 'actions';
    const copy = document.createElement('button');
    copy.type = 'button';
    copy.id = 'recovery-copy';
    copy.className = 'button secondary';
    copy.textContent = 'Copy codes';
    const status = document.createElement('p');
    status.setAttribute('role', 'status');
    copy.addEventListener('click', async () => {
      try {
        await navigator.clipboard.writeText(codes.join('\n'));
        status.textContent = 'Codes copied.';
      } catch (_) {
        status.textContent = 'Copying is not allowed here: select the codes and copy them.';
      }
    });
    const download = document.createElement('a');
    download.id = 'recovery-download';
    download.className = 'button secondary';
    download.textContent = 'Download codes';
    download.download = 'lattice-recovery-codes.txt';
    download.href = URL.createObjectURL(new Blob([`Lattice recovery codes for ${location.host}\n\n${codes.join('\n')}\n`],
      { type: 'text/plain' }));
    actions.append(copy, download);
    const saved = document.createElement('p');
    saved.className = 'check';
    const box = document.createElement('input');
    box.type = 'checkbox';
    box.id = 'recovery-saved';
    const label = document.createElement('label');
    label.htmlFor = 'recovery-saved';
    label.textContent = 'I saved these codes';
    saved.append(box, label);
    const next = document.createElement('button');
    next.type = 'button';
    next.id = 'recovery-continue';
    next.className = 'button';
    next.textContent = 'Continue';
    next.disabled = true;
    box.addEventListener('change', () => { next.disabled = !box.checked; });
    next.addEventListener('click', () => { URL.revokeObjectURL(download.href); section.remove(); resolve(); });
    section.append(heading, help, list, actions, status, saved, next);
    place.replaceChildren(section);
    section.focus();
  });
}
