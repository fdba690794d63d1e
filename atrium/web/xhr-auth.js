// Served on an app's own origin and linked first in its HTML pages (docs/api.md "Page requests").
//
// An app's page that signs in the standard way opens its XMLHttpRequest with a user and password
// (`open(method, url, true, user, password)`): the Fetch standard sends them as
// `Authorization: Basic`, and browsers answer the server's `WWW-Authenticate: Basic` challenge
// with them. The app's origin is shown in the host page's iframe, another site than the host
// page, and there Chromium neither sends nor answers with them: the app's own sign-in answered
// 401 for ever. So, for a request to the page's own origin only, the user and password an app
// gave `open` become that request's `Authorization: Basic` header, as the standard sends them.
// Nothing of Atrium's is read or sent: the app's own words go to the app's own origin.
(() => {
  const open = XMLHttpRequest.prototype.open;
  // the URL's userinfo as the browser would read it: percent-encoded by the URL, then decoded
  const decoded = (text) => {
    try {
      return decodeURIComponent(text);
    } catch {
      return text;
    }
  };
  const basic = (user, password) => {
    const bytes = new TextEncoder().encode(`${user}:${password}`);
    return `Basic ${btoa(String.fromCharCode(...bytes))}`;
  };
  XMLHttpRequest.prototype.open = function (method, url, ...rest) {
    let target;
    try {
      target = new URL(url, document.baseURI);
    } catch {
      return open.call(this, method, url, ...rest);
    }
    const [async = true, user = null, password = null] = rest;
    if (target.origin !== location.origin) return open.call(this, method, url, ...rest);
    if (user !== null && user !== undefined) target.username = String(user);
    if (password !== null && password !== undefined) target.password = String(password);
    if (!target.username && !target.password) return open.call(this, method, url, ...rest);
    const authorization = basic(decoded(target.username), decoded(target.password));
    target.username = "";
    target.password = "";
    open.call(this, method, target.href, async);
    this.setRequestHeader("Authorization", authorization);
  };
})();
