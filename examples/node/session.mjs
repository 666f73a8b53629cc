// A session and a CDP preview URL for it, through the management API.
const base = process.env.SANDGATE_URL ?? "http://127.0.0.1:8080";
const key = process.env.SANDGATE_API_KEY;

async function api(method, path, body) {
  const res = await fetch(base + path, {
    method,
    headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json" },
    body: body && JSON.stringify(body),
  });
  const data = res.status === 204 ? null : await res.json();
  if (!res.ok) throw new Error(`${method} ${path}: ${data?.error?.code}: ${data?.error?.message}`);
  return data;
}

// withSession creates a browser session, hands fn its CDP preview URL,
// and deletes the session whatever happens.
export async function withSession(fn) {
  const s = await api("POST", "/v1/sessions", { kind: "browser", ttl_seconds: 300 });
  try {
    const p = await api("POST", `/v1/sessions/${s.id}/previews`, { scope: "cdp", ttl_seconds: 300 });
    return await fn(p.url, s);
  } finally {
    await api("DELETE", `/v1/sessions/${s.id}`);
  }
}
