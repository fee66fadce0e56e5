import { signUp, hashValue, rememberNext, takeNext, announceSignIn, onSignedIn } from './api.js';
import { followSignInLink } from './signinlink.js';

const status = document.getElementById('status');

function say(text, isError = false) {
  status.textContent = text;
  status.className = isError ? 'error' : '';
}

/** Signed in: on to the share page this browser came from (if any, and only a share page), else home. */
function goOn() {
  announceSignIn();
  location.replace(takeNext() || '/');
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

document.getElementById('signup-form').addEventListener('submit', async (event) => {
  event.preventDefault();
  const name = document.getElementById('signup-name').value.trim();
  say('Signing up…');
  try {
    await signUp(name);
    goOn();
  } catch (error) {
    say(error.reason, true);
  }
});
