package desktop

import (
	"context"
	"errors"
	"fmt"
	"image"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// ErrInvalid is an action that cannot be done as asked.
var ErrInvalid = errors.New("invalid action")

// Action is one computer-use action, in the shape computer-use agents
// already send (Anthropic's computer tool): coordinates in screen pixels,
// key combos in xdotool's names ("ctrl+l", "Return").
type Action struct {
	Action          string  `json:"action"`
	Coordinate      []int   `json:"coordinate,omitempty"`
	StartCoordinate []int   `json:"start_coordinate,omitempty"`
	Text            string  `json:"text,omitempty"`
	ScrollDirection string  `json:"scroll_direction,omitempty"`
	ScrollAmount    int     `json:"scroll_amount,omitempty"`
	Duration        float64 `json:"duration,omitempty"`
	// Region is zoom's [x0, y0, x1, y1] (computer_20251124): the part of
	// the screen to return at full resolution, x1 and y1 exclusive.
	Region []int `json:"region,omitempty"`
}

// Actions is the supported action set.
var Actions = []string{
	"screenshot", "cursor_position", "mouse_move", "left_click", "right_click", "middle_click",
	"double_click", "triple_click", "left_click_drag", "left_mouse_down", "left_mouse_up",
	"scroll", "type", "key", "hold_key", "wait", "zoom",
}

const (
	maxTypeText = 10000
	maxDuration = 30 * time.Second
	maxScroll   = 50
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Step is one thing to do in the session: run a command or wait.
type Step struct {
	Argv  []string
	Sleep time.Duration
}

// Plan checks an action against the screen and turns it into xdotool
// commands. Screenshot and cursor_position are not planned here: they
// read, and the caller does them.
func Plan(a Action, width, height int) ([]Step, error) {
	point := func(c []int, name string) ([]string, error) {
		if len(c) != 2 {
			return nil, invalid("%s must be [x, y]", name)
		}
		if c[0] < 0 || c[1] < 0 || c[0] >= width || c[1] >= height {
			return nil, invalid("%s (%d, %d) is outside the %dx%d screen", name, c[0], c[1], width, height)
		}
		// No --sync: it waits for pointer motion, which never comes when
		// the pointer is already there (xdotool then hangs for 15 s).
		return []string{"mousemove", strconv.Itoa(c[0]), strconv.Itoa(c[1])}, nil
	}
	optionalMove := func() ([]string, error) {
		if a.Coordinate == nil {
			return nil, nil
		}
		return point(a.Coordinate, "coordinate")
	}
	xdo := func(args ...[]string) []Step {
		argv := []string{"xdotool"}
		for _, a := range args {
			argv = append(argv, a...)
		}
		return []Step{{Argv: argv}}
	}
	duration := func() (time.Duration, error) {
		d := time.Duration(a.Duration * float64(time.Second))
		if a.Duration < 0 || d > maxDuration {
			return 0, invalid("duration must be between 0 and %d seconds", int(maxDuration.Seconds()))
		}
		return d, nil
	}

	switch a.Action {
	case "mouse_move":
		if a.Coordinate == nil {
			return nil, invalid("mouse_move needs coordinate")
		}
		mv, err := point(a.Coordinate, "coordinate")
		if err != nil {
			return nil, err
		}
		return xdo(mv), nil
	case "left_click", "right_click", "middle_click", "double_click", "triple_click":
		mv, err := optionalMove()
		if err != nil {
			return nil, err
		}
		button, repeat := "1", "1"
		switch a.Action {
		case "right_click":
			button = "3"
		case "middle_click":
			button = "2"
		case "double_click":
			repeat = "2"
		case "triple_click":
			repeat = "3"
		}
		return held(xdo, a.Text, mv, []string{"click", "--repeat", repeat, "--delay", "80", button})
	case "left_click_drag":
		if a.StartCoordinate == nil || a.Coordinate == nil {
			return nil, invalid("left_click_drag needs start_coordinate and coordinate")
		}
		from, err := point(a.StartCoordinate, "start_coordinate")
		if err != nil {
			return nil, err
		}
		to, err := point(a.Coordinate, "coordinate")
		if err != nil {
			return nil, err
		}
		return xdo(from, []string{"mousedown", "1"}, to, []string{"mouseup", "1"}), nil
	case "left_mouse_down", "left_mouse_up":
		mv, err := optionalMove()
		if err != nil {
			return nil, err
		}
		verb := "mousedown"
		if a.Action == "left_mouse_up" {
			verb = "mouseup"
		}
		return xdo(mv, []string{verb, "1"}), nil
	case "scroll":
		mv, err := optionalMove()
		if err != nil {
			return nil, err
		}
		buttons := map[string]string{"up": "4", "down": "5", "left": "6", "right": "7"}
		b, ok := buttons[a.ScrollDirection]
		if !ok {
			return nil, invalid("scroll_direction must be up, down, left or right")
		}
		amount := a.ScrollAmount
		if amount == 0 {
			amount = 3
		}
		if amount < 1 || amount > maxScroll {
			return nil, invalid("scroll_amount must be between 1 and %d", maxScroll)
		}
		return held(xdo, a.Text, mv, []string{"click", "--repeat", strconv.Itoa(amount), "--delay", "20", b})
	case "type":
		if a.Text == "" {
			return nil, invalid("type needs text")
		}
		if len(a.Text) > maxTypeText {
			return nil, invalid("text is longer than %d bytes", maxTypeText)
		}
		return xdo([]string{"type", "--delay", "8", "--", a.Text}), nil
	case "key":
		var combos []string
		for _, c := range strings.Fields(a.Text) {
			k, err := keyCombo(c)
			if err != nil {
				return nil, err
			}
			combos = append(combos, k)
		}
		if len(combos) == 0 {
			return nil, invalid("key needs text, such as \"ctrl+l\" or \"Return\"")
		}
		return xdo(append([]string{"key", "--"}, combos...)), nil
	case "hold_key":
		k, err := keyCombo(a.Text)
		if err != nil {
			return nil, err
		}
		d, err := duration()
		if err != nil {
			return nil, err
		}
		return []Step{{Argv: []string{"xdotool", "keydown", k}}, {Sleep: d}, {Argv: []string{"xdotool", "keyup", k}}}, nil
	case "wait":
		d, err := duration()
		if err != nil {
			return nil, err
		}
		return []Step{{Sleep: d}}, nil
	case "zoom":
		_, err := ZoomRect(a.Region, width, height)
		return nil, err
	case "screenshot", "cursor_position":
		return nil, nil
	case "":
		return nil, invalid("action is required")
	default:
		return nil, invalid("unknown action %q; one of %s", a.Action, strings.Join(Actions, ", "))
	}
}

// held builds move-then-click, with the modifiers named in text ("shift")
// held down around the click.
func held(xdo func(...[]string) []Step, text string, move, click []string) ([]Step, error) {
	if text == "" {
		return xdo(move, click), nil
	}
	mods, err := keyCombo(text)
	if err != nil {
		return nil, err
	}
	return xdo(move, []string{"keydown", mods}, click, []string{"keyup", mods}), nil
}

// keyCombo checks a combo such as "ctrl+shift+t" and returns it in
// xdotool's spelling.
func keyCombo(s string) (string, error) {
	if s == "" {
		return "", invalid("a key is required")
	}
	parts := strings.Split(s, "+")
	if strings.HasSuffix(s, "++") || s == "+" { // "ctrl++" means ctrl and plus
		parts = append(strings.Split(strings.TrimSuffix(s, "++"), "+"), "plus")
	}
	for i, p := range parts {
		k, ok := keyName(p)
		if !ok {
			return "", invalid("unknown key name %q", p)
		}
		parts[i] = k
	}
	return strings.Join(parts, "+"), nil
}

var fnKey = regexp.MustCompile(`^[Ff]([1-9]|1[0-9]|2[0-4])$`)

// keyName maps a key name to an X keysym name xdotool knows.
func keyName(n string) (string, bool) {
	if len(n) == 1 {
		c := n[0]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
			return n, true
		}
		if name, ok := punctuation[c]; ok {
			return name, true
		}
		return "", false
	}
	if fnKey.MatchString(n) {
		return "F" + n[1:], true
	}
	if k, ok := keysyms[n]; ok {
		return k, true
	}
	if k, ok := aliases[strings.ToLower(n)]; ok {
		return k, true
	}
	return "", false
}

var punctuation = map[byte]string{
	' ': "space", '!': "exclam", '"': "quotedbl", '#': "numbersign", '$': "dollar", '%': "percent",
	'&': "ampersand", '\'': "apostrophe", '(': "parenleft", ')': "parenright", '*': "asterisk",
	'+': "plus", ',': "comma", '-': "minus", '.': "period", '/': "slash", ':': "colon",
	';': "semicolon", '<': "less", '=': "equal", '>': "greater", '?': "question", '@': "at",
	'[': "bracketleft", '\\': "backslash", ']': "bracketright", '^': "asciicircum", '_': "underscore",
	'`': "grave", '{': "braceleft", '|': "bar", '}': "braceright", '~': "asciitilde",
}

// keysyms are X keysym names accepted as written.
var keysyms = map[string]string{}

func init() {
	for _, k := range []string{
		"Return", "Tab", "space", "BackSpace", "Delete", "Escape", "Home", "End", "Page_Up", "Page_Down",
		"Prior", "Next", "Left", "Right", "Up", "Down", "Insert", "Caps_Lock", "Num_Lock", "Scroll_Lock",
		"Print", "Pause", "Menu", "Break", "Linefeed", "Clear", "Select", "Find", "Cancel", "Help",
		"Shift_L", "Shift_R", "Control_L", "Control_R", "Alt_L", "Alt_R", "Meta_L", "Meta_R",
		"Super_L", "Super_R", "Hyper_L", "Hyper_R", "ISO_Left_Tab",
		"KP_Enter", "KP_Add", "KP_Subtract", "KP_Multiply", "KP_Divide", "KP_Decimal", "KP_Equal",
		"KP_Home", "KP_End", "KP_Up", "KP_Down", "KP_Left", "KP_Right", "KP_Page_Up", "KP_Page_Down",
		"KP_Insert", "KP_Delete", "KP_Begin",
		"XF86AudioMute", "XF86AudioRaiseVolume", "XF86AudioLowerVolume", "XF86AudioPlay",
		"XF86AudioPause", "XF86AudioNext", "XF86AudioPrev", "XF86Back", "XF86Forward", "XF86Refresh",
		"XF86Reload", "XF86HomePage", "XF86Search", "XF86Copy", "XF86Paste", "XF86Cut",
		"minus", "equal", "plus", "bracketleft", "bracketright", "semicolon", "apostrophe", "grave",
		"backslash", "comma", "period", "slash", "asterisk", "underscore", "exclam", "at", "numbersign",
		"dollar", "percent", "asciicircum", "ampersand", "parenleft", "parenright", "colon", "quotedbl",
		"less", "greater", "question", "bar", "braceleft", "braceright", "asciitilde",
	} {
		keysyms[k] = k
	}
	for i := 0; i <= 9; i++ {
		keysyms["KP_"+strconv.Itoa(i)] = "KP_" + strconv.Itoa(i)
	}
}

// aliases are the lower-case names agents also use.
var aliases = map[string]string{
	"ctrl": "ctrl", "control": "ctrl", "alt": "alt", "shift": "shift", "super": "super",
	"meta": "meta", "cmd": "super", "command": "super", "win": "super", "windows": "super",
	"enter": "Return", "return": "Return", "tab": "Tab", "space": "space", "backspace": "BackSpace",
	"delete": "Delete", "del": "Delete", "escape": "Escape", "esc": "Escape", "home": "Home",
	"end": "End", "pageup": "Page_Up", "page_up": "Page_Up", "pagedown": "Page_Down",
	"page_down": "Page_Down", "left": "Left", "right": "Right", "up": "Up", "down": "Down",
	"insert": "Insert", "capslock": "Caps_Lock", "print": "Print", "pause": "Pause", "menu": "Menu",
	"arrowleft": "Left", "arrowright": "Right", "arrowup": "Up", "arrowdown": "Down",
}

// Executor runs a command in the session's display environment and
// returns its standard output.
type Executor interface {
	Exec(ctx context.Context, argv []string) ([]byte, error)
}

// Run carries out the planned steps.
func Run(ctx context.Context, ex Executor, steps []Step) error {
	for _, s := range steps {
		if s.Sleep > 0 {
			select {
			case <-time.After(s.Sleep):
			case <-ctx.Done():
				return ctx.Err()
			}
			continue
		}
		if _, err := ex.Exec(ctx, s.Argv); err != nil {
			return err
		}
	}
	return nil
}

// CursorPosition asks the session's display where the pointer is.
func CursorPosition(ctx context.Context, ex Executor) (x, y int, err error) {
	out, err := ex.Exec(ctx, []string{"xdotool", "getmouselocation", "--shell"})
	if err != nil {
		return 0, 0, err
	}
	vals := map[string]int{}
	for _, line := range strings.Split(string(out), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		if ok {
			n, err := strconv.Atoi(v)
			if err == nil {
				vals[k] = n
			}
		}
	}
	xv, okx := vals["X"]
	yv, oky := vals["Y"]
	if !okx || !oky {
		return 0, 0, fmt.Errorf("xdotool getmouselocation: unexpected output %q", out[:min(len(out), 200)])
	}
	return xv, yv, nil
}

// ZoomRect checks zoom's region [x0, y0, x1, y1] against the screen and
// returns it as a rectangle.
func ZoomRect(region []int, width, height int) (image.Rectangle, error) {
	if len(region) != 4 {
		return image.Rectangle{}, invalid("zoom needs region [x0, y0, x1, y1]")
	}
	r := image.Rect(region[0], region[1], region[2], region[3])
	if region[0] >= region[2] || region[1] >= region[3] || !r.In(image.Rect(0, 0, width, height)) {
		return image.Rectangle{}, invalid("region [%d, %d, %d, %d] must be a non-empty part of the %dx%d screen", region[0], region[1], region[2], region[3], width, height)
	}
	return r, nil
}
