package egress

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"html"
	"html/template"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// scrubAll reads body through a scrubReader, from a source that hands
// out chunk bytes at a time.
func scrubAll(t testing.TB, body []byte, chunk int, secrets ...string) []byte {
	var src io.Reader = bytes.NewReader(body)
	if chunk > 0 {
		src = &chunkReader{b: body, n: chunk}
	}
	out, err := io.ReadAll(newScrubReader(io.NopCloser(src), needles(secrets...)))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

type chunkReader struct {
	b []byte
	n int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), c.n)], c.b)
	c.b = c.b[n:]
	return n, nil
}

// echoes writes secret in every form a server may echo it in, at every
// base64 alignment, between unrelated text.
func echoes(secret string) []string {
	js, _ := json.Marshal(secret)
	out := []string{
		secret,
		url.QueryEscape(secret),
		url.PathEscape(secret),
		strings.ToLower(url.QueryEscape(secret)),
		string(js),
		strings.ReplaceAll(string(js), "/", `\/`),
		"Basic " + base64.StdEncoding.EncodeToString([]byte("user:"+secret)),
	}
	for pre := 0; pre < 4; pre++ {
		p := strings.Repeat("z", pre)
		out = append(out,
			base64.StdEncoding.EncodeToString([]byte(p+secret+"tail")),
			base64.URLEncoding.EncodeToString([]byte(p+secret)),
			base64.RawURLEncoding.EncodeToString([]byte(p+secret+"!")))
	}
	return out
}

func TestScrubReader(t *testing.T) {
	for _, secret := range []string{"s3cr3t-canary", `p@ss w0rd&"x"+/<>`, "ünïcödé-secret", "abcd"} {
		for i, e := range echoes(secret) {
			body := []byte("before: " + e + " :after " + strings.Repeat("-", i*1000) + e)
			for _, chunk := range []int{0, 1, 3, 7, 4096} {
				out := scrubAll(t, body, chunk, secret)
				if len(out) != len(body) {
					t.Fatalf("%q chunk %d: %d bytes out of %d", e, chunk, len(out), len(body))
				}
				for _, n := range needles(secret) {
					if bytes.Contains(out, n) {
						t.Fatalf("secret %q, echo %q, chunk %d: %q is left in %q", secret, e, chunk, n, out)
					}
				}
				if !bytes.HasPrefix(out, []byte("before: ")) || !bytes.Contains(out, []byte(" :after ")) {
					t.Fatalf("the text around the echo changed: %q", out)
				}
			}
		}
	}
	// Control: a body without the secret passes byte for byte, however
	// it is chunked.
	body := bytes.Repeat([]byte("nothing to see here; s3cr3t-canar y "), 5000)
	for _, chunk := range []int{0, 1, 13} {
		if out := scrubAll(t, body, chunk, "s3cr3t-canary"); !bytes.Equal(out, body) {
			t.Fatalf("chunk %d: a clean body changed", chunk)
		}
	}
}

func TestScrubHeader(t *testing.T) {
	const secret = "s3cr3t/canary+"
	h := http.Header{}
	h.Set("X-Plain", "v="+secret)
	h.Set("X-B64", base64.StdEncoding.EncodeToString([]byte("u:"+secret)))
	h.Set("Location", "/x?k="+url.QueryEscape(secret))
	h.Set("X-Fine", "fine")
	scrubHeader(h, needles(secret))
	if len(h) != 1 || h.Get("X-Fine") != "fine" {
		t.Errorf("headers left: %v", h)
	}
}

// FuzzScrubber: whatever the secret, body and chunking, what comes out is
// as long as what went in and shows none of the secret's forms.
func FuzzScrubber(f *testing.F) {
	f.Add("s3cr3t-canary", []byte("a s3cr3t-canary b czNjcjN0LWNhbmFyeQ== c"), uint8(1))
	f.Add(`p@ss "x"`, []byte(`{"pass":"p@ss \"x\""} p%40ss+%22x%22`), uint8(3))
	f.Add("abcdef", []byte("YWJjZGVm eWFiY2RlZg zzabcdefzz"), uint8(0))
	f.Fuzz(func(t *testing.T, secret string, body []byte, chunk uint8) {
		if len(secret) > 256 || strings.ContainsRune(secret, maskByte) {
			return
		}
		out := scrubAll(t, body, int(chunk), secret)
		if len(out) != len(body) {
			t.Fatalf("%d bytes out of %d", len(out), len(body))
		}
		for _, n := range needles(secret) {
			if bytes.Contains(out, n) {
				t.Fatalf("%q is left in %q", n, out)
			}
		}
	})
}

// BenchmarkScrubReader: the cost of scrubbing a bound host's response.
func BenchmarkScrubReader(b *testing.B) {
	body := bytes.Repeat([]byte("<div class=\"row\">some page text, no secret here</div>\n"), 20000)
	ns := needles(`p@ss w0rd&"x"+/`)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		io.Copy(io.Discard, newScrubReader(io.NopCloser(bytes.NewReader(body)), ns))
	}
}

// A page that writes a secret back into its HTML escapes it: each way of
// escaping is masked; the control shows the same body passes unmasked
// when scrubbed for another secret.
func TestScrubHTMLEchoes(t *testing.T) {
	const secret = `p@ss w0rd&"x'+/<>`
	for _, e := range []string{
		html.EscapeString(secret),
		template.HTMLEscapeString(secret),
		strings.ReplaceAll(html.EscapeString(secret), "+", "&#43;"),
		strings.NewReplacer("&#34;", "&quot;", "&#39;", "&#x27;").Replace(html.EscapeString(secret)),
		numericEntities(secret),
		// Rails, Spring and Lodash; PHP's htmlspecialchars with
		// ENT_QUOTES, and with ENT_HTML5; hex references.
		strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&#39;").Replace(secret),
		strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&#039;").Replace(secret),
		strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&apos;").Replace(secret),
		strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#x22;", "'", "&#x27;").Replace(secret),
		hexEntities(secret, "&#x%x;"),
		hexEntities(secret, "&#x%X;"),
		// Mustache.js; Handlebars.
		strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&#39;", "/", "&#x2F;", "`", "&#x60;", "=", "&#x3D;").Replace(secret + "=="),
		strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&#x27;", "`", "&#x60;", "=", "&#x3D;").Replace(secret + "=="),
		// In a script: JavaScript escapes.
		strings.NewReplacer("'", `\'`, `"`, `\"`).Replace(secret),
		strings.NewReplacer("'", `\u0027`, `"`, `\u0022`).Replace(secret),
		strings.NewReplacer("'", `\x27`, `"`, `\x22`).Replace(secret),
		jsEscapes(secret, `\u%04x`),
		jsEscapes(secret, `\u%04X`),
		jsEscapes(secret, `\x%02x`),
	} {
		body := []byte(`<input value="` + e + `">`)
		if out := scrubAll(t, body, 5, secret); bytes.Contains(out, []byte(e)) {
			t.Errorf("the echo %q is left in %q", e, out)
		}
		if out := scrubAll(t, body, 5, "another-secret"); !bytes.Equal(out, body) {
			t.Errorf("control: scrubbing for another secret changed %q into %q", body, out)
		}
	}
}
