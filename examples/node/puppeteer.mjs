// Puppeteer drives a session's Chromium: connect with the preview URL as
// the browser's WebSocket endpoint (browserURL would drop its path, and
// the token in it).
//   SANDGATE_URL=... SANDGATE_API_KEY=... node puppeteer.mjs https://example.com
import puppeteer from "puppeteer-core";
import { withSession } from "./session.mjs";

await withSession(async (cdpURL) => {
  const browser = await puppeteer.connect({ browserWSEndpoint: cdpURL.replace(/^http/, "ws") });
  const page = await browser.newPage();
  await page.goto(process.argv[2]);
  console.log("title:", await page.title());
  console.log("h1:", await page.$eval("h1", (el) => el.textContent));
  await browser.disconnect();
});
