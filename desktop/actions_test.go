package desktop

import (
	"errors"
	"reflect"
	"testing"
)

func TestPlan(t *testing.T) {
	cases := []struct {
		a    Action
		want [][]string
	}{
		{Action{Action: "left_click", Coordinate: []int{10, 20}}, [][]string{{"xdotool", "mousemove", "10", "20", "click", "--repeat", "1", "--delay", "80", "1"}}},
		{Action{Action: "double_click"}, [][]string{{"xdotool", "click", "--repeat", "2", "--delay", "80", "1"}}},
		{Action{Action: "key", Text: "ctrl+l"}, [][]string{{"xdotool", "key", "--", "ctrl+l"}}},
		{Action{Action: "key", Text: "Enter"}, [][]string{{"xdotool", "key", "--", "Return"}}},
		{Action{Action: "key", Text: "ctrl+shift+t Page_Down"}, [][]string{{"xdotool", "key", "--", "ctrl+shift+t", "Page_Down"}}},
		{Action{Action: "type", Text: "-rf /"}, [][]string{{"xdotool", "type", "--delay", "8", "--", "-rf /"}}},
		{Action{Action: "scroll", Coordinate: []int{5, 5}, ScrollDirection: "down", ScrollAmount: 4}, [][]string{{"xdotool", "mousemove", "5", "5", "click", "--repeat", "4", "--delay", "20", "5"}}},
		{Action{Action: "left_click_drag", StartCoordinate: []int{1, 2}, Coordinate: []int{3, 4}}, [][]string{{"xdotool", "mousemove", "1", "2", "mousedown", "1", "mousemove", "3", "4", "mouseup", "1"}}},
	}
	for _, tc := range cases {
		steps, err := Plan(tc.a, 100, 100)
		if err != nil {
			t.Fatalf("%+v: %v", tc.a, err)
		}
		var got [][]string
		for _, s := range steps {
			got = append(got, s.Argv)
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%+v:\n got %q\nwant %q", tc.a, got, tc.want)
		}
	}
}

func TestPlanRejects(t *testing.T) {
	for name, a := range map[string]Action{
		"unknown action":   {Action: "teleport"},
		"no action":        {},
		"off screen":       {Action: "left_click", Coordinate: []int{100, 5}},
		"negative":         {Action: "mouse_move", Coordinate: []int{-1, 5}},
		"one coordinate":   {Action: "mouse_move", Coordinate: []int{1}},
		"unknown key":      {Action: "key", Text: "ctrl+hyperdrive"},
		"empty key":        {Action: "key"},
		"bad direction":    {Action: "scroll", ScrollDirection: "sideways"},
		"huge scroll":      {Action: "scroll", ScrollDirection: "up", ScrollAmount: 1000},
		"long wait":        {Action: "wait", Duration: 3600},
		"negative hold":    {Action: "hold_key", Text: "shift", Duration: -1},
		"drag without end": {Action: "left_click_drag", StartCoordinate: []int{1, 1}},
		"empty type":       {Action: "type"},
		"zoom no region":   {Action: "zoom"},
		"zoom three":       {Action: "zoom", Region: []int{0, 0, 10}},
		"zoom empty":       {Action: "zoom", Region: []int{10, 10, 10, 20}},
		"zoom reversed":    {Action: "zoom", Region: []int{50, 50, 10, 10}},
		"zoom past screen": {Action: "zoom", Region: []int{0, 0, 101, 50}},
		"zoom negative":    {Action: "zoom", Region: []int{-1, 0, 10, 10}},
	} {
		if _, err := Plan(a, 100, 100); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err %v, want ErrInvalid", name, err)
		}
	}
}

// TestZoomRect: a region inside the screen is accepted as given (x1, y1
// exclusive), the whole screen included; TestPlanRejects has the others.
func TestZoomRect(t *testing.T) {
	for _, region := range [][]int{{0, 0, 100, 100}, {10, 20, 30, 60}, {99, 99, 100, 100}} {
		r, err := ZoomRect(region, 100, 100)
		if err != nil || r.Min.X != region[0] || r.Min.Y != region[1] || r.Max.X != region[2] || r.Max.Y != region[3] {
			t.Errorf("%v: %v %v", region, r, err)
		}
		if _, err := Plan(Action{Action: "zoom", Region: region}, 100, 100); err != nil {
			t.Errorf("plan zoom %v: %v", region, err)
		}
	}
}
