// Playwright drives a session's Chromium: connectOverCDP with the
// preview URL, nothing else changed.
//   SANDGATE_URL=... SANDGATE_API_KEY=... node playwright.mjs https://example.com
import { chromium } from "playwright-core";
import { withSession } from "./session.mjs";

await withSession(async (cdpURL) => {
  const browser = await chromium.connectOverCDP(cdpURL);
  const context = browser.contexts()[0];
  const page = context.pages()[0] ?? (await context.newPage());
  await page.goto(process.argv[2]);
  console.log("title:", await page.title());
  console.log("h1:", await page.locator("h1").first().textContent());
  await browser.close(); // disconnects; the session's browser stays until the session ends
});
