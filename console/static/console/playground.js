/* The playground: each message goes to the gateway's session-authenticated chat endpoint as a streaming
 * request (SSE, OpenAI's chunk shape) asking for usage in every chunk, so the token counts grow with the answer.
 * The answer is written as text, never as HTML. Stop aborts the request; the gateway then ends it on the engine
 * and bills only what was produced. */
(function () {
  "use strict";

  function csrfToken() {
    try { return JSON.parse(document.body.getAttribute("hx-headers"))["X-CSRFToken"]; } catch (e) { return ""; }
  }

  function errorText(data, status) {
    if (data && data.error && data.error.message) return data.error.message;
    return "The gateway answered HTTP " + status + ".";
  }

  function StreamError(message) { this.message = message; }

  // Calls onChunk(chunk) for every data event up to [DONE]; StreamError for an error event or a cut stream.
  async function readEvents(response, onChunk) {
    var reader = response.body.getReader(), decoder = new TextDecoder(), buffer = "";
    for (;;) {
      var read = await reader.read();
      if (read.done) throw new StreamError("The answer stopped before it was complete.");
      buffer += decoder.decode(read.value, { stream: true });
      var events = buffer.split("\n\n");
      buffer = events.pop();
      for (var i = 0; i < events.length; i++) {
        var lines = events[i].split("\n");
        for (var j = 0; j < lines.length; j++) {
          if (lines[j].indexOf("data: ") !== 0) continue;
          var payload = lines[j].slice(6);
          if (payload === "[DONE]") return;
          var chunk = JSON.parse(payload);
          if (chunk.error) throw new StreamError(chunk.error.message || "The engine failed.");
          onChunk(chunk);
        }
      }
    }
  }

  function Playground(form) {
    this.form = form;
    this.endpoint = form.dataset.endpoint;
    this.model = form.querySelector("#pg-model");
    this.prompt = form.querySelector("#pg-prompt");
    this.system = form.querySelector("#pg-system");
    this.maxTokens = form.querySelector("#pg-max-tokens");
    this.temperature = form.querySelector("#pg-temperature");
    this.sendButton = form.querySelector("[data-send]");
    this.stopButton = form.querySelector("[data-stop]");
    this.transcript = document.querySelector("[data-transcript]");
    this.empty = document.querySelector("[data-empty]");
    this.status = document.querySelector("[data-pg-status]");
    this.messages = [];  // the conversation so far, in OpenAI's shape
    this.controller = null;
    var self = this;
    form.addEventListener("submit", function (event) { event.preventDefault(); self.send(); });
    this.prompt.addEventListener("keydown", function (event) {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) { event.preventDefault(); self.send(); }
    });
    this.stopButton.addEventListener("click", function () { if (self.controller) self.controller.abort(); });
    form.querySelector("[data-clear]").addEventListener("click", function () { self.clear(); });
  }

  Playground.prototype.say = function (text, isError) {
    this.status.textContent = text;
    this.status.classList.toggle("error", !!isError);
  };

  Playground.prototype.clear = function () {
    if (this.controller) this.controller.abort();
    this.messages = [];
    this.transcript.textContent = "";
    this.empty.hidden = false;
    this.say("");
    this.showCounts(null);
    this.prompt.focus();
  };

  Playground.prototype.turn = function (role, text, model) {
    var item = document.createElement("li");
    item.className = "turn turn-" + role;
    var who = document.createElement("p");
    who.className = "turn-who";
    who.textContent = role === "user" ? "You" : model;
    var body = document.createElement("div");
    body.className = "turn-text";
    body.textContent = text;
    item.appendChild(who);
    item.appendChild(body);
    this.transcript.appendChild(item);
    this.empty.hidden = true;
    return body;
  };

  Playground.prototype.showCounts = function (usage, firstMs, elapsedMs) {
    var set = function (id, value) { document.querySelector('[data-testid="' + id + '"]').textContent = value; };
    set("prompt-tokens", usage ? usage.prompt_tokens : "–");
    set("completion-tokens", usage ? usage.completion_tokens : "–");
    set("total-tokens", usage ? usage.total_tokens : "–");
    set("first-token", firstMs == null ? "–" : Math.round(firstMs) + " ms");
    var speed = usage && elapsedMs && firstMs != null && usage.completion_tokens > 1 && elapsedMs > firstMs
      ? ((usage.completion_tokens - 1) / ((elapsedMs - firstMs) / 1000)).toFixed(1) + " tokens/s" : "–";
    set("speed", speed);
  };

  Playground.prototype.body = function (messages) {
    var system = this.system.value.trim();
    var body = {
      model: this.model.value,
      messages: (system ? [{ role: "system", content: system }] : []).concat(messages),
      stream: true,
      stream_options: { include_usage: true, continuous_usage_stats: true },
    };
    var maxTokens = parseInt(this.maxTokens.value, 10), temperature = parseFloat(this.temperature.value);
    if (maxTokens > 0) body.max_tokens = maxTokens;
    if (!isNaN(temperature)) body.temperature = temperature;
    return body;
  };

  Playground.prototype.busy = function (on) {
    this.sendButton.disabled = on;
    this.stopButton.disabled = !on;
    this.transcript.setAttribute("aria-busy", on ? "true" : "false");
  };

  Playground.prototype.send = async function () {
    var text = this.prompt.value.trim();
    if (!text || this.controller) return;
    var model = this.model.value, asked = this.messages.concat([{ role: "user", content: text }]);
    var request = this.body(asked);
    this.turn("user", text);
    var answer = this.turn("assistant", "", model), written = "", usage = null, finish = null;
    var started = performance.now(), firstMs = null, self = this;
    this.prompt.value = "";
    this.showCounts(null);
    this.say(model + " is answering\u2026");
    this.controller = new AbortController();
    this.busy(true);
    try {
      var response = await fetch(this.endpoint, {
        method: "POST", credentials: "same-origin", signal: this.controller.signal,
        headers: { "Content-Type": "application/json", "Accept": "text/event-stream", "X-CSRFToken": csrfToken() },
        body: JSON.stringify(request),
      });
      if (!response.ok) {
        var data = null;
        try { data = await response.json(); } catch (e) { data = null; }
        throw new StreamError(errorText(data, response.status));
      }
      await readEvents(response, function (chunk) {
        var choice = (chunk.choices || [])[0];
        if (choice && choice.delta && choice.delta.content) {
          if (firstMs === null) firstMs = performance.now() - started;
          written += choice.delta.content;
          answer.textContent = written;
        }
        if (choice && choice.finish_reason) finish = choice.finish_reason;
        if (chunk.usage) {
          usage = chunk.usage;
          self.showCounts(usage, firstMs, performance.now() - started);
        }
      });
      this.messages = asked.concat([{ role: "assistant", content: written }]);
      this.say("Answered by " + model + (usage ? ": " + usage.prompt_tokens + " prompt and " + usage.completion_tokens +
        " completion tokens" : "") + (finish === "length" ? ", cut at the max tokens." : "."));
    } catch (error) {
      var stopped = error && error.name === "AbortError";
      if (written) this.messages = asked.concat([{ role: "assistant", content: written }]);
      answer.parentNode.classList.add(stopped ? "turn-stopped" : "turn-error");
      if (!written) answer.textContent = stopped ? "(stopped)" : error.message;
      this.say(stopped ? "Stopped." + (usage ? " " + usage.completion_tokens + " completion tokens were produced and billed." : "")
        : "No answer: " + error.message, !stopped);
      if (!written && !stopped) this.prompt.value = text;  // nothing came back: the message can be sent again
    } finally {
      this.controller = null;
      this.busy(false);
    }
  };

  document.addEventListener("DOMContentLoaded", function () {
    var form = document.querySelector("form[data-playground]");
    if (form) new Playground(form);
  });
})();
