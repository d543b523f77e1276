/* nabla: the whole public API. Each library's header also compiles alone. */
#ifndef NABLA_H
#define NABLA_H
#include "nabla/core.h"
#include "nabla/compile.h"
#include "nabla/data.h"
#include "nabla/optim.h"
#include "nabla/nn.h"
#include "nabla/models.h"
#include "nabla/tokenizer.h"
#include "nabla/ckpt.h"
#include "nabla/prof.h"
#include "nabla/train.h"
#include "nabla/serve.h"
#include "nabla/quant.h"
#include "nabla/posttrain.h"
#endif
