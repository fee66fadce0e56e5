// The web client's service worker (scope `/`, allowed by the server's Service-Worker-Allowed header).
// Web files are fetched from the network first, so an update shows at once, and kept in a cache that
// answers when the network or the server is away; `/` then opens the client from the cache, which
// shows the lists and unsent changes the page kept in IndexedDB. The API (/auth/, /database/), share
// pages and assets (/assets/: upload URLs, and download URLs, which are per reader and work for an hour)
// are never cached or answered here: only `/` and /web/ are.
const CACHE = 'lattice-web-v1';
const SHELL = [
  '/web/index.html', '/web/app.js', '/web/api.js', '/web/crdt.js', '/web/sequence.js', '/web/replica.js', '/web/store.js',
  '/web/signinlink.js', '/web/style.css', '/web/favicon.svg', '/web/manifest.webmanifest', '/web/icon-192.png',
];

self.addEventListener('install', (event) => {
  event.waitUntil(caches.open(CACHE).then((cache) => cache.addAll(SHELL)).then(() => self.skipWaiting()));
});

self.addEventListener('activate', (event) => {
  event.waitUntil(caches.keys()
    .then((keys) => Promise.all(keys.filter((key) => key !== CACHE).map((key) => caches.delete(key))))
    .then(() => self.clients.claim()));
});

/** The network's answer (kept when it is a web file), else the cached copy. */
async function networkFirst(request, fallbackURL) {
  const cache = await caches.open(CACHE);
  try {
    const response = await fetch(request);
    if (response.ok && !fallbackURL) await cache.put(request, response.clone());
    return response;
  } catch (error) {
    const cached = await cache.match(fallbackURL || request, { ignoreSearch: true });
    if (cached) return cached;
    throw error;
  }
}

/** Keeps the client page as `/` last answered it (with its headers, CSP included) for opening offline. */
async function keepClient(response) {
  if (!response.ok || response.type !== 'basic') return;
  const text = await response.clone().text();
  if (text.includes('/web/app.js')) await (await caches.open(CACHE)).put('/web/index.html', response);
}

self.addEventListener('fetch', (event) => {
  const request = event.request;
  if (request.method !== 'GET') return;
  const url = new URL(request.url);
  if (url.origin !== self.location.origin) return;
  if (request.mode === 'navigate' && url.pathname === '/') {
    // Signed in, `/` is the client; signed out, the sign-in page: always the network's when it answers.
    event.respondWith(networkFirst(request, '/web/index.html').then((response) => {
      keepClient(response.clone());
      return response;
    }));
  } else if (url.pathname.startsWith('/web/')) {
    event.respondWith(networkFirst(request, null));
  }
});
