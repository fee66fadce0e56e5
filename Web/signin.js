import { signUp, exchangeSignInLink, hashValue, safeNext } from './api.js';

const status = document.getElementById('status');

function say(text, isError = false) {
  status.textContent = text;
  status.className = isError ? 'error' : '';
}

function goOn() {
  const next = safeNext(sessionStorage.getItem('lattice.next'));
  sessionStorage.removeItem('lattice.next');
  location.replace(next || '/');
}

/** What the address's fragment asks for: a page to come back to, sign-up, or a one-time sign-in link. */
function followHash() {
  const next = safeNext(hashValue('next'));
  if (next) sessionStorage.setItem('lattice.next', next);
  if (hashValue('signup') !== null) document.getElementById('signup-name').focus();
  const secret = hashValue('signin');
  if (secret) {
    history.replaceState(null, '', '/'); // the one-time secret leaves the address bar at once
    say('Signing in…');
    exchangeSignInLink(secret).then(goOn, (error) => say(error.reason, true));
  }
}

followHash();
// Opening a link to this same page only changes the fragment: no new page load.
window.addEventListener('hashchange', followHash);

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
