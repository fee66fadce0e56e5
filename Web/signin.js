import { signUp, hashValue, rememberNext, takeNext, announceSignIn, onSignedIn, postWithoutSession } from './api.js';
import { followSignInLink } from './signinlink.js';
import { passkeysSupported, createPasskey, usePasskey, passkeyProblem, showRecoveryCodes } from './passkeys.js';

const status = document.getElementById('status');
const main = document.getElementById('signin');

function say(text, isError = false) {
  status.textContent = text;
  status.className = isError ? 'error' : '';
}

/** Signed in: on to the share page this browser came from (if any, and only a share page), else home. */
function goOn() {
  announceSignIn();
  location.replace(takeNext() || '/');
}

/** A new account: its recovery codes are shown once, then on. */
async function signedUp(answer) {
  if (Array.isArray(answer.recoveryCodes) && answer.recoveryCodes.length) {
    say('');
    await showRecoveryCodes(main, answer.recoveryCodes);
  }
  goOn();
}

/** What the address's fragment asks for: a page to come back to, sign-up, or a one-time sign-in link. */
function followHash() {
  rememberNext(hashValue('next'));
  if (hashValue('signup') !== null) document.getElementById('signup-name').focus();
  const secret = hashValue('signin');
  if (secret) {
    history.replaceState(null, '', '/'); // the one-time secret leaves the address bar at once
    say('Signing in…');
    // Signed out, this is one exchange. If another tab signed this browser in meanwhile, the person is
    // asked before the link replaces that session; staying goes home as the signed-in account.
    followSignInLink(secret, document.getElementById('signin'))
      .then((session) => (session ? goOn() : location.replace('/')), (error) => say(error.reason, true));
  }
}

followHash();
// Opening a link to this same page only changes the fragment: no new page load.
window.addEventListener('hashchange', followHash);
// Signed in from another tab (a sign-in link opened there): this tab reloads, and the web client, given
// this tab's `#next`, goes back to the share page.
onSignedIn(() => location.reload());

const nameField = document.getElementById('signup-name');

document.getElementById('signup-form').addEventListener('submit', async (event) => {
  event.preventDefault();
  const name = nameField.value.trim();
  say('Signing up…');
  try {
    await signedUp(await signUp(name));
  } catch (error) {
    say(error.reason, true);
  }
});

if (passkeysSupported()) {
  for (const id of ['signup-passkey', 'signin-passkey', 'passkey-help']) document.getElementById(id).hidden = false;
  document.getElementById('signup-button').textContent = 'Sign up without a passkey';
  document.getElementById('signup-button').className = 'button secondary';

  document.getElementById('signup-passkey').addEventListener('click', async () => {
    if (!nameField.reportValidity()) return;
    const name = nameField.value.trim();
    say('Making a passkey…');
    try {
      const options = await postWithoutSession('/auth/passkey/signup/options', { name });
      const credential = await createPasskey(options);
      say('Signing up…');
      await signedUp(await postWithoutSession('/auth/passkey/signup', { credential, name: 'Passkey' }));
    } catch (error) {
      say(passkeyProblem(error), true);
    }
  });

  document.getElementById('signin-passkey').addEventListener('click', async () => {
    say('Waiting for your passkey…');
    try {
      const options = await postWithoutSession('/auth/passkey/signin/options', {});
      const credential = await usePasskey(options);
      say('Signing in…');
      await postWithoutSession('/auth/passkey/signin', { credential });
      goOn();
    } catch (error) {
      say(passkeyProblem(error), true);
    }
  });
}

document.getElementById('recovery-form').addEventListener('submit', async (event) => {
  event.preventDefault();
  say('Signing in…');
  try {
    const answer = await postWithoutSession('/auth/recovery', { code: document.getElementById('recovery-code').value });
    document.getElementById('recovery-code').value = '';
    const left = answer.recoveryCodesLeft;
    sessionStorage.setItem('lattice.recoveryNotice',
      left === 0 ? 'You used your last recovery code: make new ones on the Account page.'
                 : `Signed in with a recovery code; ${left} left. Add a passkey on the Account page.`);
    goOn();
  } catch (error) {
    say(error.reason, true);
  }
});
