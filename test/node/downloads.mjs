// Downloads made by unmodified Playwright and Puppeteer through a Sandgate
// preview URL (run by test/downloads_compat_test.go).
// usage: node downloads.mjs playwright|puppeteer PREVIEW_URL PAGES_URL TAG
// Each download of a blob holds "<TAG>-<label>"; the output is one line
// of JSON, {"downloads": [{"label", "suggested", "failure"}]}, after which
// the client keeps its pages open until its stdin ends.
import { chromium } from "playwright-core";
import puppeteer from "puppeteer-core";

const [client, previewURL, pagesURL, tag] = process.argv.slice(2);
const out = { downloads: [] };

// blobDownload makes the page download "<tag>-<label>" as <label>.txt.
const blobDownload = ([text, name]) => {
  const a = document.createElement("a");
  a.href = URL.createObjectURL(new Blob([text], { type: "text/plain" }));
  a.download = name;
  document.body.appendChild(a);
  a.click();
};

if (client === "playwright") {
  const browser = await chromium.connectOverCDP(previewURL);
  const take = async (page, label, start, timeout = 30000) => {
    let download;
    try {
      [download] = await Promise.all([page.waitForEvent("download", { timeout }), start()]);
    } catch (e) {
      out.downloads.push({ label, suggested: "", failure: "no download event: " + e.message.split("\n")[0] });
      return;
    }
    // Waits for Chromium's Browser.downloadProgress: Playwright still gets
    // its download events.
    const failure = await download.failure();
    out.downloads.push({ label, suggested: download.suggestedFilename(), failure });
  };
  // The default context: a link to a file served by the test hosts.
  const context = browser.contexts()[0];
  const page = await context.newPage();
  await page.goto(pagesURL + "/download.html");
  await take(page, "link", () => page.click("#dl"));
  // A context of Playwright's own: a blob.
  const own = await browser.newContext();
  const page2 = await own.newPage();
  await page2.goto(pagesURL + "/hello.html");
  await take(page2, "own-context", () => page2.evaluate(blobDownload, [tag + "-own-context", "own-context.txt"]));
  // A context that refuses downloads: Playwright denies them, and that is
  // honoured.
  const refusing = await browser.newContext({ acceptDownloads: false });
  const page3 = await refusing.newPage();
  await page3.goto(pagesURL + "/hello.html");
  await take(page3, "denied", () => page3.evaluate(blobDownload, [tag + "-denied", "denied.txt"]), 10000);
  await report();
  await own.close();
  await refusing.close();
  await page.close();
  await browser.close();
} else if (client === "puppeteer") {
  // Puppeteer's own download behaviour, with a path of its own: the
  // gateway keeps the file where it stores downloads from.
  const browser = await puppeteer.connect({
    browserWSEndpoint: previewURL.replace(/^http/, "ws"),
    downloadBehavior: { policy: "allow", downloadPath: "/tmp/puppeteer-downloads" },
  });
  const page = await browser.newPage();
  await page.goto(pagesURL + "/hello.html");
  await page.evaluate(blobDownload, [tag + "-puppeteer", "puppeteer.txt"]);
  out.downloads.push({ label: "puppeteer", suggested: "puppeteer.txt", failure: null });
  // Puppeteer has no download events: the test watches the artifacts.
  await report();
  await page.close();
  await browser.disconnect();
} else {
  throw new Error("unknown client " + client);
}

// report prints what the client saw and waits until the test closes
// stdin, so that the pages stay open while the test looks for the files.
async function report() {
  console.log(JSON.stringify(out));
  process.stdin.resume();
  await new Promise((resolve) => process.stdin.on("end", resolve));
}
