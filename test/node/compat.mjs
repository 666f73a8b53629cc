// Unmodified Playwright and Puppeteer against a Sandgate preview URL.
// usage: node compat.mjs playwright|puppeteer[-header] PREVIEW_URL PAGE_URL
import { chromium } from "playwright-core";
import puppeteer from "puppeteer-core";

const [client, previewURL, pageURL] = process.argv.slice(2);
// The "-header" clients send the token in an Authorization header, as
// Playwright MCP's --cdp-header does, to an endpoint without it.
const u = new URL(previewURL);
const headers = { Authorization: "Bearer " + u.pathname.split("/").pop() };
const wsOrigin = u.origin.replace(/^http/, "ws");

// connect returns the browser and how to leave it; leaving disconnects,
// a CDP-connected browser is not closed by it.
async function connect() {
  switch (client) {
    case "playwright":
    case "playwright-header": {
      const browser = client === "playwright"
        ? await chromium.connectOverCDP(previewURL)
        : await chromium.connectOverCDP(u.origin + "/cdp", { headers });
      const context = browser.contexts()[0] ?? (await browser.newContext());
      return { open: () => context.newPage(), leave: () => browser.close() };
    }
    case "puppeteer":
    case "puppeteer-header": {
      // Puppeteer's browserURL drops any path (it asks new
      // URL("/json/version", browserURL)) and sends no headers with it, so
      // the browser's WebSocket endpoint is given: the preview URL with a
      // ws scheme, or /cdp with the header.
      const browser = client === "puppeteer"
        ? await puppeteer.connect({ browserWSEndpoint: previewURL.replace(/^http/, "ws") })
        : await puppeteer.connect({ browserWSEndpoint: wsOrigin + "/cdp", headers });
      return { open: () => browser.newPage(), leave: () => browser.disconnect() };
    }
  }
  throw new Error("unknown client " + client);
}

const { open, leave } = await connect();
const page = await open();
await page.goto(pageURL);
const out = { title: await page.title(), answer: await page.evaluate(() => window.answer) };
await page.close();
await leave();
console.log(JSON.stringify(out));
