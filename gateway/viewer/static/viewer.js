// The live viewer: connects noVNC to the session's display through the
// gateway, scales it to the window, and counts down to the preview's expiry.
import "./novnc.js";

const root = document.getElementById("screen");
const data = document.body.dataset;
const status = document.getElementById("status");
const countdown = document.getElementById("countdown");
const viewOnly = data.viewOnly === "true";
const expires = new Date(data.expiresAt);

const rfb = new window.RFB(root, data.socket, { shared: true });
rfb.viewOnly = viewOnly;
rfb.scaleViewport = true;
rfb.resizeSession = false;
rfb.focusOnClick = !viewOnly;
rfb.addEventListener("connect", () => {
  status.textContent = "live";
  document.body.classList.add("connected");
});
rfb.addEventListener("disconnect", (e) => {
  document.body.classList.remove("connected");
  status.textContent = e.detail.clean ? "disconnected" : "connection lost";
  if (Date.now() >= expires.getTime()) status.textContent = "preview expired";
});
window.sandgateRFB = rfb;

function tick() {
  const left = Math.max(0, Math.round((expires.getTime() - Date.now()) / 1000));
  const m = Math.floor(left / 60), s = left % 60;
  countdown.textContent = `${m}:${String(s).padStart(2, "0")}`;
  countdown.classList.toggle("soon", left < 60);
  if (left > 0) setTimeout(tick, 1000 - (Date.now() % 1000));
}
tick();
