/* Adapter uploads straight to S3 with a progress bar (the registry's presigned path):
 *   1. (new adapter) POST {api}                          {name, description}
 *   2. POST {api}{name}/uploads/                         {files: [{name, size}]} -> one URL per part
 *   3. PUT each part's bytes to its URL (XHR, for upload progress)
 *   4. POST {api}{name}/uploads/{id}/complete/           -> the new version, validated by the Celery worker
 * A failure after step 2 aborts the upload (its quota reservation ends); a failure of a new adapter's first upload
 * deletes the adapter it created, so nothing half-made is left. Files come from the file input or a drop (the
 * two PEFT files, the PEFT folder itself, or one archive). */
(function () {
  "use strict";

  var PARALLEL_PARTS = 3;

  function csrfToken() {
    try { return JSON.parse(document.body.getAttribute("hx-headers"))["X-CSRFToken"]; } catch (e) { return ""; }
  }

  function ApiError(status, message, data) {
    this.status = status;
    this.message = message;
    this.data = data;
  }

  function describe(data, status) {
    if (data && Array.isArray(data.errors) && data.errors.length) {
      return data.errors.map(function (e) { return e.detail; }).join(" ");
    }
    if (data && typeof data.detail === "string") return data.detail;
    return "The server answered HTTP " + status + ".";
  }

  async function api(method, url, body) {
    var response = await fetch(url, {
      method: method, credentials: "same-origin",
      headers: { "X-CSRFToken": csrfToken(), "Content-Type": "application/json", "Accept": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    var data = null;
    if (response.status !== 204) {
      try { data = await response.json(); } catch (e) { data = null; }
    }
    if (!response.ok) throw new ApiError(response.status, describe(data, response.status), data);
    return data;
  }

  function humanSize(bytes) {
    var units = ["bytes", "KB", "MB", "GB"];
    var n = bytes, i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return (i === 0 ? n : n.toFixed(1)) + " " + units[i];
  }

  // ------------------------------------------------------------ choosing files

  function readEntries(reader) {
    return new Promise(function (resolve, reject) { reader.readEntries(resolve, reject); });
  }

  function entryFile(entry) {
    return new Promise(function (resolve, reject) { entry.file(resolve, reject); });
  }

  async function folderFiles(entry) {
    // A dropped PEFT folder: its top-level files (PEFT saves no subfolders), hidden ones left out.
    var reader = entry.createReader(), entries = [], batch;
    do { batch = await readEntries(reader); entries = entries.concat(batch); } while (batch.length);
    var files = entries.filter(function (e) { return e.isFile && e.name.charAt(0) !== "."; });
    return Promise.all(files.map(entryFile));
  }

  async function droppedFiles(transfer) {
    var items = Array.prototype.slice.call(transfer.items || []);
    var entries = items.map(function (item) { return item.webkitGetAsEntry ? item.webkitGetAsEntry() : null; });
    if (entries.length && entries.some(function (e) { return e && e.isDirectory; })) {
      var lists = await Promise.all(entries.map(function (e) { return e && e.isDirectory ? folderFiles(e) : e ? entryFile(e).then(function (f) { return [f]; }) : []; }));
      return [].concat.apply([], lists);
    }
    return Array.prototype.slice.call(transfer.files || []);
  }

  // ------------------------------------------------------------ the bytes to S3

  function putPart(url, blob, onProgress, requests) {
    return new Promise(function (resolve, reject) {
      var xhr = new XMLHttpRequest();
      requests.push(xhr);
      xhr.open("PUT", url);
      xhr.upload.onprogress = function (event) { onProgress(event.loaded); };
      xhr.onload = function () {
        if (xhr.status >= 200 && xhr.status < 300) { onProgress(blob.size); resolve(); }
        else reject(new Error("The storage refused a part of the upload (HTTP " + xhr.status + ")."));
      };
      xhr.onerror = function () { reject(new Error("The storage could not be reached; check your connection and try again.")); };
      xhr.onabort = function () { reject(new Error("The upload was interrupted.")); };
      xhr.send(blob);  // a slice has no type: no Content-Type header, nothing beyond what the URL signs
    });
  }

  async function putAll(files, targets, onProgress) {
    var jobs = [], loaded = [], requests = [];
    targets.forEach(function (target, f) {
      var offset = 0;
      target.urls.forEach(function (url, p) {
        var start = offset, size = target.part_sizes[p], index = jobs.length;
        offset += size;
        loaded.push(0);
        jobs.push(function () {
          return putPart(url, files[f].slice(start, start + size), function (bytes) {
            loaded[index] = bytes;
            onProgress(loaded.reduce(function (a, b) { return a + b; }, 0));
          }, requests);
        });
      });
    });
    var next = 0;
    async function worker() {
      while (next < jobs.length) { var job = jobs[next]; next += 1; await job(); }
    }
    try {
      await Promise.all(Array.from({ length: Math.min(PARALLEL_PARTS, jobs.length) }, worker));
    } catch (error) {
      next = jobs.length;  // start no further part
      requests.forEach(function (xhr) { xhr.abort(); });
      throw error;
    }
  }

  // ------------------------------------------------------------ the form

  function Uploader(form) {
    this.form = form;
    this.api = form.dataset.api;
    this.pages = form.dataset.pages;
    this.existing = form.dataset.adapter || "";
    this.maxFiles = parseInt(form.dataset.maxFiles, 10);
    this.maxBytes = parseInt(form.dataset.maxBytes, 10);
    this.files = [];
    this.input = form.querySelector("[data-file-input]");
    this.zone = form.querySelector("[data-dropzone]");
    this.list = form.querySelector("[data-file-list]");
    this.progressRow = form.querySelector("[data-progress-row]");
    this.progress = form.querySelector("[data-progress]");
    this.progressLabel = form.querySelector("[data-progress-label]");
    this.status = form.querySelector("[data-upload-status]");
    this.submit = form.querySelector("[data-upload-submit]");
    this.nameField = form.querySelector("#adapter-name");
    this.nameError = form.querySelector("[data-name-error]");
    this.bind();
  }

  Uploader.prototype.bind = function () {
    var self = this;
    this.input.addEventListener("change", function () { self.choose(Array.prototype.slice.call(self.input.files)); });
    ["dragenter", "dragover"].forEach(function (type) {
      self.zone.addEventListener(type, function (event) {
        event.preventDefault();
        self.zone.classList.add("dragging");
      });
    });
    ["dragleave", "dragend"].forEach(function (type) {
      self.zone.addEventListener(type, function (event) {
        if (!self.zone.contains(event.relatedTarget)) self.zone.classList.remove("dragging");
      });
    });
    this.zone.addEventListener("drop", function (event) {
      event.preventDefault();
      self.zone.classList.remove("dragging");
      droppedFiles(event.dataTransfer).then(function (files) { self.choose(files); },
        function () { self.say("Those files could not be read; choose them with the button instead.", true); });
    });
    this.form.addEventListener("submit", function (event) {
      event.preventDefault();
      self.run();
    });
  };

  Uploader.prototype.say = function (text, isError) {
    this.status.textContent = text;
    this.status.classList.toggle("error", !!isError);
  };

  Uploader.prototype.choose = function (files) {
    this.files = files;
    this.list.textContent = "";
    var total = 0;
    files.forEach(function (file) {
      var item = document.createElement("li");
      item.textContent = file.name + " · " + humanSize(file.size);
      this.list.appendChild(item);
      total += file.size;
    }, this);
    this.progressRow.hidden = true;
    this.say(files.length ? files.length + " file" + (files.length > 1 ? "s" : "") + " chosen, " + humanSize(total) + "." : "");
  };

  Uploader.prototype.problem = function () {
    if (!this.files.length) return "Choose or drop the adapter's files first.";
    if (this.files.length > this.maxFiles) return "That is " + this.files.length + " files; an upload holds at most " + this.maxFiles + ".";
    var total = this.files.reduce(function (sum, f) { return sum + f.size; }, 0);
    if (total > this.maxBytes) return "The files are " + humanSize(total) + "; at most " + humanSize(this.maxBytes) + " fit in this upload (the platform's limit or the storage left in your quota).";
    if (!this.existing && !this.nameField.value.trim()) return "Give the adapter a name.";
    return "";
  };

  Uploader.prototype.showProgress = function (done, total) {
    var percent = total ? Math.floor(100 * done / total) : 100;
    this.progressRow.hidden = false;
    this.progress.value = percent;
    this.progressLabel.textContent = humanSize(done) + " of " + humanSize(total) + " (" + percent + "%)";
  };

  Uploader.prototype.busy = function (on) {
    this.submit.disabled = on;
    this.input.disabled = on;
    this.form.setAttribute("aria-busy", on ? "true" : "false");
  };

  Uploader.prototype.run = async function () {
    var problem = this.problem();
    this.setNameError("");
    if (problem) { this.say(problem, true); return; }
    var name = this.existing || this.nameField.value.trim();
    var base = this.api + encodeURIComponent(name) + "/";
    var files = this.files, created = false, uploadId = null, self = this;
    var total = this.total = files.reduce(function (sum, f) { return sum + f.size; }, 0);
    this.busy(true);
    try {
      if (!this.existing) {
        this.say("Creating the adapter…");
        await api("POST", this.api, { name: name, description: this.form.querySelector("#adapter-description").value });
        created = true;
      }
      this.say("Uploading…");
      var started = await api("POST", base + "uploads/", { files: files.map(function (f) { return { name: f.name, size: f.size }; }) });
      uploadId = started.upload.id;
      this.showProgress(0, total);
      await putAll(files, started.targets, function (done) { self.showProgress(done, total); });
      var version = await api("POST", base + "uploads/" + uploadId + "/complete/");
      this.finished(name, version);
    } catch (error) {
      await this.undo(base, uploadId, created);
      this.failed(error);
    } finally {
      this.busy(false);
    }
  };

  Uploader.prototype.undo = async function (base, uploadId, created) {
    try {
      if (created) await api("DELETE", base);  // also aborts its uploads
      else if (uploadId) await api("DELETE", base + "uploads/" + uploadId + "/");
    } catch (e) { /* the registry expires what is left */ }
  };

  Uploader.prototype.setNameError = function (text) {
    if (!this.nameField) return;
    this.nameError.textContent = text;
    if (text) this.nameField.setAttribute("aria-invalid", "true");
    else this.nameField.removeAttribute("aria-invalid");
  };

  Uploader.prototype.failed = function (error) {
    var nameProblem = error instanceof ApiError && error.data && Array.isArray(error.data.errors) &&
      error.data.errors.some(function (e) { return e.attr === "name"; });
    if (nameProblem) {
      this.setNameError(error.message);
      this.nameField.focus();
    }
    this.say("Upload failed: " + error.message, true);
  };

  Uploader.prototype.finished = function (name, version) {
    var message = "Version " + version.version + " of \u201c" + name + "\u201d is uploaded; checking it now.";
    this.showProgress(this.total, this.total);
    if (!this.existing) {  // the new adapter's page follows the check
      this.say(message + " Opening its page\u2026");
      window.location.assign(this.pages + encodeURIComponent(name) + "/");
      return;
    }
    this.files = [];
    this.list.textContent = "";
    this.input.value = "";
    this.say(message);
    this.watching = version.version;
    if (window.htmx) {  // the versions again, now polled until this one is finished
      window.htmx.ajax("GET", window.location.pathname, { target: "#adapter-live", select: "#adapter-live", swap: "outerHTML" });
    }
  };

  Uploader.prototype.report = function (live) {
    // After each refresh of the versions: say how the version just uploaded ended, once it has.
    if (!this.watching || String(this.watching) !== live.dataset.newest) return;
    var status = live.dataset.newestStatus;
    if (status === "ready") {
      this.say("Version " + this.watching + " is ready and serving.");
      this.watching = null;
    } else if (status === "failed") {
      this.say("Version " + this.watching + " failed validation: " + live.dataset.newestReason, true);
      this.watching = null;
    }
  };

  document.addEventListener("DOMContentLoaded", function () {
    var forms = Array.prototype.slice.call(document.querySelectorAll("form[data-upload]"));
    var uploaders = forms.map(function (form) { return new Uploader(form); });
    document.addEventListener("htmx:afterSettle", function () {
      var live = document.getElementById("adapter-live");
      if (live) uploaders.forEach(function (u) { u.report(live); });
    });
  });
})();
