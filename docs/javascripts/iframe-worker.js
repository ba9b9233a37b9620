// Search on a page opened from disk (file://). The theme's search runs in a Web Worker, which a browser
// will not start from a file:// page; mkdocs-material's offline plugin would load a shim for that from a
// CDN, unless a polyfill's name contains "iframe-worker" (mkdocs.yml lists this file in extra.polyfills).
// Here the worker's script runs in a hidden iframe of the page instead, with the worker's postMessage
// and importScripts, and messages pass both ways as events. The theme's search worker looks for
// `IFrameWorker` on its parent to find its scripts. Pages served over http(s) keep the real Worker.
(() => {
  if (location.protocol !== "file:") return;

  const later = (callback) => setTimeout(callback, 0); // a worker's messages never arrive synchronously

  class IFrameWorker extends EventTarget {
    constructor(url) {
      super();
      this.onmessage = null;
      this.onerror = null;
      this.frame = document.createElement("iframe");
      this.frame.hidden = true;
      document.body.appendChild(this.frame);
      const scope = this.frame.contentWindow;
      scope.postMessage = (data) => later(() => this.emit(new MessageEvent("message", {data: structuredClone(data)})));
      scope.importScripts = (...urls) => urls.reduce((done, src) => done.then(() => this.load(src)), Promise.resolve());
      this.ready = this.load(String(url)).catch((error) => {
        this.emit(new ErrorEvent("error", {message: `cannot load the worker script ${url}`, error}));
        throw error;
      });
    }

    // A script of the worker, run in its iframe; resolves once it has run.
    load(src) {
      const page = this.frame.contentDocument;
      return new Promise((resolve, reject) => {
        const script = page.createElement("script");
        script.src = src;
        script.onload = resolve;
        script.onerror = reject;
        page.body.appendChild(script);
      });
    }

    emit(event) {
      this.dispatchEvent(event);
      const handler = event.type === "message" ? this.onmessage : this.onerror;
      if (handler) handler.call(this, event);
    }

    postMessage(data) {
      const copy = structuredClone(data);
      const scope = this.frame.contentWindow;
      this.ready.then(() => later(() => scope.dispatchEvent(new scope.MessageEvent("message", {data: copy}))), () => {});
    }

    terminate() {
      this.frame.remove();
    }
  }

  window.IFrameWorker = IFrameWorker;
  window.Worker = IFrameWorker;
})();
