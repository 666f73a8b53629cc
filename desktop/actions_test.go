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
	} {
		if _, err := Plan(a, 100, 100); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err %v, want ErrInvalid", name, err)
		}
	}
}
