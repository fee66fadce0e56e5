// Sign-in through the OpenID Connect providers this server accepts: one link per provider, to
// /auth/oidc/start, which sends the browser to the provider and back (Docs/API.md). The page to come back
// to (a share page) goes along as `next`.
import { peekNext } from './api.js';

const place = document.getElementById('providers');

async function show() {
  if (!place) return;
  let providers = [];
  try {
    const response = await fetch('/auth/oidc/providers', { credentials: 'same-origin', headers: { Accept: 'application/json' } });
    if (response.ok) providers = (await response.json()).providers || [];
  } catch (_) {
    return; // offline, or an older server: no provider buttons
  }
  if (!providers.length) return;
  for (const provider of providers) {
    const link = document.createElement('a');
    link.className = 'button secondary';
    link.id = `provider-${provider.provider}`;
    link.textContent = `Continue with ${provider.name}`;
    link.href = provider.start;
    // The share page to come back to (remembered when sign-in began) goes along, read when clicked.
    link.addEventListener('click', () => {
      const next = peekNext();
      link.href = provider.start + (next ? '&next=' + encodeURIComponent(next) : '');
    });
    place.append(link);
  }
  place.hidden = false;
}

show();
