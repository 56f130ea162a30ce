// hookrelay's pages work without scripts; this only opens a portal link without a click when
// scripts run (the form is there for those that do not).
document.addEventListener("DOMContentLoaded", function () {
  var open = document.querySelector("form[data-autosubmit]");
  if (open) { open.submit(); }
});
