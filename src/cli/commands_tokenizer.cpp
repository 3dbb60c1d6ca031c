// `tokenize`, `detokenize`, `chat-template`: the tokenizer and chat template from a folder that
// may hold only tokenizer files. stdout carries exactly the result; errors go to stderr.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace ds {

namespace {


std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) cli_fail("cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::shared_ptr<tok::Tokenizer> load(const std::string& dir) {
  auto t = tok::Tokenizer::load_dir(dir);
  if (!t.ok()) cli_fail(t.status().message());
  return t.value();
}


struct TokenizerArgs {
  std::string model_dir, text, file, ids, messages, tools, kwargs;
  bool has_text = false, add_generation_prompt = false, skip_special = false;
};

nlohmann::ordered_json read_json_file(const std::string& path, const char* what) {
  auto j = nlohmann::ordered_json::parse(read_text(path), nullptr, false);
  if (j.is_discarded()) cli_fail(std::string(what) + " " + path + " is not valid JSON");
  return j;
}

}  // namespace

void register_tokenizer_commands(CLI::App& app) {
  auto args = std::make_shared<TokenizerArgs>();

  CLI::App* tk = app.add_subcommand("tokenize", "print the token ids of a text as a JSON array");
  tk->add_option("--model", args->model_dir, "folder with tokenizer.json (weights not needed)")->required();
  auto* text_opt = tk->add_option("--text", args->text, "text to tokenize (special tokens are recognized)");
  auto* file_opt = tk->add_option("--file", args->file, "file whose bytes are tokenized");
  text_opt->excludes(file_opt);
  tk->callback([args, text_opt, file_opt] {
    if (!*text_opt && !*file_opt) cli_fail("tokenize needs --text or --file");
    std::string text = *text_opt ? args->text : read_text(args->file);
    auto t = load(args->model_dir);
    auto ids = t->encode(text);
    if (!ids.ok()) cli_fail(ids.status().message());
    std::string out = "[";
    for (size_t i = 0; i < ids->size(); ++i) {
      if (i) out += ",";
      out += std::to_string((*ids)[i]);
    }
    out += "]\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
  });

  CLI::App* dt = app.add_subcommand("detokenize", "print the text of comma-separated token ids");
  dt->add_option("--model", args->model_dir, "folder with tokenizer.json (weights not needed)")->required();
  dt->add_option("--ids", args->ids, "token ids, comma-separated")->required();
  dt->add_flag("--skip-special-tokens", args->skip_special, "drop special tokens such as <|im_end|>");
  dt->callback([args] {
    auto t = load(args->model_dir);
    auto text = t->decode(cli_parse_ids(args->ids), args->skip_special);
    if (!text.ok()) cli_fail(text.status().message());
    std::fwrite(text->data(), 1, text->size(), stdout);
  });

  CLI::App* ct = app.add_subcommand("chat-template", "print the rendered chat prompt (no added newline)");
  ct->add_option("--model", args->model_dir, "folder with tokenizer_config.json holding chat_template")->required();
  ct->add_option("--messages", args->messages, "JSON file: the messages array")->required();
  ct->add_option("--tools", args->tools, "JSON file: the tools array");
  ct->add_option("--kwargs", args->kwargs, "JSON file: an object of extra template variables (enable_thinking, ...)");
  ct->add_flag("--add-generation-prompt", args->add_generation_prompt, "end with the assistant turn's opening");
  ct->callback([args] {
    auto t = load(args->model_dir);
    if (t->chat_template().empty()) cli_fail(args->model_dir + "/tokenizer_config.json has no chat_template");
    auto tmpl = tok::ChatTemplate::parse(t->chat_template());
    if (!tmpl.ok()) cli_fail("chat_template: " + tmpl.status().message());
    tok::ChatRequest req;
    req.messages = read_json_file(args->messages, "--messages");
    if (!args->tools.empty()) req.tools = read_json_file(args->tools, "--tools");
    if (!args->kwargs.empty()) req.kwargs = read_json_file(args->kwargs, "--kwargs");
    req.add_generation_prompt = args->add_generation_prompt;
    req.bos_token = t->bos_token();
    req.eos_token = t->eos_token();
    auto out = tmpl->render(req);
    if (!out.ok()) cli_fail("chat_template: " + out.status().message());
    std::fwrite(out->data(), 1, out->size(), stdout);
  });
}

}  // namespace ds
