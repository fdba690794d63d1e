// Atrium's theme client, served to apps at /_os/client.js: on an `os.theme.changed` message from
// the host page, re-link every stylesheet that points at the shell's theme CSS so the new palette
// applies without a reload.
(() => {
  const THEME_CSS = "/_os/api/os/theme.css";
  window.addEventListener("message", (event) => {
    const data = event.data;
    if (!data || data.type !== "os.theme.changed") return;
    for (const link of document.querySelectorAll('link[rel="stylesheet"]')) {
      const url = new URL(link.href, location.href);
      if (url.pathname !== THEME_CSS) continue;
      url.searchParams.set("v", String(Date.now()));
      link.href = url.toString();
    }
    const mode = document.querySelector('meta[name="os-color-mode"]');
    if (mode && data.colorMode) mode.content = data.colorMode;
    document.dispatchEvent(new CustomEvent("os-theme-changed", {detail: data}));
  });
})();
