// Unmodified Playwright and Puppeteer against a Sandgate preview URL.
// usage: node compat.mjs playwright|puppeteer[-header] PREVIEW_URL PAGE_URL
import { chromium } from "playwright-core";
import puppeteer from "puppeteer-core";

const [client, previewURL, pageURL] = process.argv.slice(2);
const out = {};
// The "-header" clients send the token in an Authorization header, as
// Playwright MCP's --cdp-header does, to an endpoint without it.
const u = new URL(previewURL);
const token = u.pathname.split("/").pop();
const headers = { Authorization: "Bearer " + token };
if (client === "playwright-header") {
  const browser = await chromium.connectOverCDP(u.origin + "/cdp", { headers });
  const page = await (browser.contexts()[0] ?? (await browser.newContext())).newPage();
  await page.goto(pageURL);
  out.title = await page.title();
  out.answer = await page.evaluate(() => window.answer);
  await page.close();
  await browser.close();
} else if (client === "puppeteer-header") {
  // Puppeteer sends no headers with browserURL's discovery: the
  // WebSocket endpoint /cdp is the browser's.
  const browser = await puppeteer.connect({ browserWSEndpoint: u.origin.replace(/^http/, "ws") + "/cdp", headers });
  const page = await browser.newPage();
  await page.goto(pageURL);
  out.title = await page.title();
  out.answer = await page.evaluate(() => window.answer);
  await page.close();
  await browser.disconnect();
} else if (client === "playwright") {
  const browser = await chromium.connectOverCDP(previewURL);
  const context = browser.contexts()[0] ?? (await browser.newContext());
  const page = await context.newPage();
  await page.goto(pageURL);
  out.title = await page.title();
  out.answer = await page.evaluate(() => window.answer);
  await page.close();
  // Disconnects; a CDP-connected browser is not closed by this.
  await browser.close();
} else if (client === "puppeteer") {
  // Puppeteer's browserURL drops any path (it asks new URL("/json/version",
  // browserURL)), so a token in the path cannot reach it; the preview URL
  // with a ws scheme is the browser's WebSocket endpoint.
  const browser = await puppeteer.connect({ browserWSEndpoint: previewURL.replace(/^http/, "ws") });
  const page = await browser.newPage();
  await page.goto(pageURL);
  out.title = await page.title();
  out.answer = await page.evaluate(() => window.answer);
  await page.close();
  await browser.disconnect();
} else {
  throw new Error("unknown client " + client);
}
console.log(JSON.stringify(out));
