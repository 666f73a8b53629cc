package gateway

import (
	_ "embed"
	"encoding/json"
	"fmt"

	"github.com/gofiber/fiber/v2"
	"go.yaml.in/yaml/v3"
)

// openapiYAML is the OpenAPI 3.1 document of the gateway's routes. The
// parity test (openapi_test.go) holds it equal to the registered routes.
//
//go:embed openapi.yaml
var openapiDoc []byte

// openapiJSON converts the document to JSON, once, when the server is
// built.
func openapiJSON() ([]byte, error) {
	var doc any
	if err := yaml.Unmarshal(openapiDoc, &doc); err != nil {
		return nil, fmt.Errorf("gateway: openapi.yaml: %w", err)
	}
	doc, err := jsonValue(doc)
	if err != nil {
		return nil, fmt.Errorf("gateway: openapi.yaml: %w", err)
	}
	return json.Marshal(doc)
}

// jsonValue turns what YAML decoded into values JSON can encode: mapping
// keys become strings (status codes such as 200 decode as integers).
func jsonValue(v any) (any, error) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			j, err := jsonValue(e)
			if err != nil {
				return nil, err
			}
			v[k] = j
		}
		return v, nil
	case map[any]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			j, err := jsonValue(e)
			if err != nil {
				return nil, err
			}
			switch k.(type) {
			case string, int, int64, uint64, bool:
				out[fmt.Sprint(k)] = j
			default:
				return nil, fmt.Errorf("mapping key %v of type %T", k, k)
			}
		}
		return out, nil
	case []any:
		for i, e := range v {
			j, err := jsonValue(e)
			if err != nil {
				return nil, err
			}
			v[i] = j
		}
		return v, nil
	default:
		return v, nil
	}
}

// openapiYAML and openapiJSONDoc serve the document, without an API
// key: it describes the API and holds no secret.
func (s *Server) openapiYAML(c *fiber.Ctx) error {
	c.Set(fiber.HeaderContentType, "application/yaml")
	return c.Send(openapiDoc)
}

func (s *Server) openapiJSONDoc(c *fiber.Ctx) error {
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return c.Send(s.openapiJSON)
}
