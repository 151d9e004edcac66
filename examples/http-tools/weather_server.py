"""A tiny HTTP service for the http-tools example, standard library only.

    python3 weather_server.py [PORT]     (default 8765; 127.0.0.1 only)

POST /weather with {"city": ...} answers {"city": ..., "forecast": ..., "celsius": ...}.
It prints the Idempotency-Key and X-Corral-Run-Id headers Corral sends with each call.
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

FORECASTS = {"paris": ("sunny", 21), "oslo": ("snow", -3)}


class Weather(BaseHTTPRequestHandler):
    def do_POST(self):
        if self.path != "/weather":
            self.send_error(404)
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        city = str(body.get("city", ""))
        forecast, celsius = FORECASTS.get(city.lower(), ("unknown", None))
        print(
            f"call for {city!r}: Idempotency-Key {self.headers.get('Idempotency-Key')}, "
            f"run {self.headers.get('X-Corral-Run-Id')}",
            flush=True,
        )
        data = json.dumps({"city": city, "forecast": forecast, "celsius": celsius}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format, *args):  # the print above says enough
        pass


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8765
    server = HTTPServer(("127.0.0.1", port), Weather)
    print(f"listening on http://127.0.0.1:{server.server_port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
