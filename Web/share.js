// The share page (rendered by the server): the Join button joins with the browser's session. A page
// that offers sign-in remembers itself, so signing in (here, in another tab, or with a sign-in link
// typed into this one) comes back to it; it reloads when another tab signs in.
import { Api, currentSession, rememberNext, onSignedIn } from './api.js';

const join = document.getElementById('join');
const status = document.getElementById('status');

if (document.getElementById('signin-actions')) {
  rememberNext(location.pathname);
  onSignedIn(() => location.reload());
}

if (join) {
  join.addEventListener('click', async () => {
    join.disabled = true;
    status.textContent = 'Joining…';
    status.className = '';
    try {
      const session = await currentSession();
      if (!session) { location.assign('/#next=' + encodeURIComponent(location.pathname)); return; }
      const token = location.pathname.slice('/share/'.length);
      const reply = await new Api(session).call('shared', 'records/accept', { shortGUIDs: [{ value: token }] });
      const result = (reply.results || [])[0] || {};
      if (result.serverErrorCode) throw new Error(result.reason);
      location.assign('/#list=' + encodeURIComponent(result.rootRecordName || ''));
    } catch (error) {
      status.textContent = error.reason || error.message;
      status.className = 'error';
      join.disabled = false;
      join.focus();
    }
  });
}
