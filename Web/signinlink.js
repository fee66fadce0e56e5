// Following a one-time sign-in link (`/#signin=`) without letting a stranger's link switch this browser
// to the stranger's account (login CSRF): a signed-in browser asks the person first. Docs/Web.md.
import { ApiError, exchangeSignInLink } from './api.js';

/**
 * Exchanges `secret` for a session. Signed out, or signed in to the link's own account: one exchange, no
 * question. Signed in to another account: the server refuses the silent switch (CONFLICT naming both
 * accounts), and a question at the top of `place` offers "Switch to X" and "Stay as Y"; only the first
 * exchanges the link again, with `replaceSession`. Resolves to the new session, or null if the person stayed.
 */
export async function followSignInLink(secret, place) {
  try {
    return await exchangeSignInLink(secret);
  } catch (error) {
    const { signedInAs, linkAccount } = (error instanceof ApiError && error.code === 'CONFLICT' && error.body) || {};
    if (typeof signedInAs !== 'string' || typeof linkAccount !== 'string') throw error;
    if (!(await askToSwitch(place, signedInAs, linkAccount))) return null;
    return exchangeSignInLink(secret, true);
  }
}

/** Shows the question and resolves to true for "Switch to `linkAccount`", false for "Stay as `signedInAs`". */
function askToSwitch(place, signedInAs, linkAccount) {
  document.getElementById('switch-account')?.remove();
  const box = document.createElement('section');
  box.id = 'switch-account';
  box.className = 'switch-account';
  box.setAttribute('role', 'alertdialog');
  box.setAttribute('aria-labelledby', 'switch-account-heading');
  box.setAttribute('aria-describedby', 'switch-account-text');
  const heading = document.createElement('h2');
  heading.id = 'switch-account-heading';
  heading.textContent = 'Switch accounts?';
  const text = document.createElement('p');
  text.id = 'switch-account-text';
  text.textContent = `This sign-in link is for the account ${linkAccount}. You are signed in as ${signedInAs}. `
    + 'Switch only if you asked for this link yourself: lists you make afterwards are kept in the account you use.';
  const actions = document.createElement('div');
  actions.className = 'actions';
  const stay = document.createElement('button');
  stay.type = 'button';
  stay.id = 'switch-account-stay';
  stay.className = 'button';
  stay.textContent = `Stay as ${signedInAs}`;
  const go = document.createElement('button');
  go.type = 'button';
  go.id = 'switch-account-confirm';
  go.className = 'button secondary';
  go.textContent = `Switch to ${linkAccount}`;
  actions.append(stay, go);
  box.append(heading, text, actions);
  place.prepend(box);
  stay.focus();
  return new Promise((resolve) => {
    const choose = (choice) => () => { box.remove(); resolve(choice); };
    stay.addEventListener('click', choose(false));
    go.addEventListener('click', choose(true));
  });
}
