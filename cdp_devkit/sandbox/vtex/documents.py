"""JSON documents rendered from a store's columns, shaped like VTEX's responses.

Field names and types follow VTEX's OpenAPI specs (``/work/shared/reference/vtex-openapi``); every
well-formed document validates against the 200-response schema of the path that serves it. Only
values derived from the columns and stable hashes are used, so rendering is deterministic.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from cdp_devkit.sandbox.vtex import vocabulary as vocab
from cdp_devkit.sandbox.vtex.generator import (
    CANCELED,
    INVOICED,
    MALFORMED_KINDS,
    STATUS_DESCRIPTIONS,
    STATUSES,
    TICKS_PER_DAY,
    format_ticks,
    guid_text,
)

if TYPE_CHECKING:
    from cdp_devkit.sandbox.vtex.generator import Store

_FIRST_ASCII = tuple(vocab.ascii_fold(name) for name in vocab.FIRST_NAMES)
_LAST_ASCII = tuple(vocab.ascii_fold(name) for name in vocab.LAST_NAMES)
_OPEN_STATUSES = frozenset(i for i in range(len(STATUSES)) if i not in (INVOICED, CANCELED))
_UNPARSEABLE, _NO_LAST_CHANGE, _TEXT_VALUE, _NO_ORDER_ID = range(len(MALFORMED_KINDS))

_STORE_PREFERENCES = {
    "countryCode": "BRA",
    "currencyCode": "BRL",
    "currencyFormatInfo": {
        "CurrencyDecimalDigits": 2,
        "CurrencyDecimalSeparator": ",",
        "CurrencyGroupSeparator": ".",
        "CurrencyGroupSize": 3,
        "StartsWithCurrencySymbol": True,
    },
    "currencyLocale": 1046,
    "currencySymbol": "R$",
    "timeZone": "E. South America Standard Time",
}


def _hex(*parts: object) -> str:
    return hashlib.md5(":".join(map(str, parts)).encode()).hexdigest()


def masked_email(account: str, user_profile_id: str) -> str:
    """Conversation Tracker hard mask: stable per buyer, the real address cannot be recovered."""
    return f"{_hex('ct', account, user_profile_id)}@ct.vtex.com.br"


# ----- people -----------------------------------------------------------------------------------


def _last_name(store: Store, row: int) -> str:
    buyers = store.buyers
    last = vocab.LAST_NAMES[buyers.last_name[row]]
    second = int(buyers.last_name2[row])
    return last if second < 0 else f"{last} {vocab.LAST_NAMES[second]}"


def _phone(store: Store, row: int, style: int) -> str:
    ddd = vocab.CITIES[store.buyers.city[row]][2]
    number = str(int(store.buyers.phone[row]))
    if style == 0:
        return f"+55{ddd}{number}"
    if style == 1:
        return f"({ddd}) {number[:5]}-{number[5:]}"
    if style == 2:
        return f"{ddd}{number}"
    return f"+55 {ddd} {number[:5]}-{number[5:]}"


def customer_email(store: Store, row: int) -> str:
    """The CL e-mail as the customer typed it (case and padding variants included)."""
    buyers = store.buyers
    source = int(buyers.email_source[row])
    first = _FIRST_ASCII[buyers.first_name[source]]
    last = _LAST_ASCII[buyers.last_name[source]]
    num = int(buyers.email_num[source])
    style = int(buyers.email_style[source])
    if style == 0:
        local = f"{first}.{last}{num}"
    elif style == 1:
        local = f"{first}{last}{num}"
    elif style == 2:
        local = f"{first[0]}{last}{num}"
    elif style == 3:
        local = f"{first}_{last}{num}"
    else:
        local = f"{last}.{first}{num}"
    address = f"{local}@{vocab.EMAIL_DOMAINS[buyers.email_domain[source]][0]}"
    variant = int(buyers.email_variant[row])
    if variant == 1:
        return address[0].upper() + address[1:]
    if variant == 2:
        return address.upper()
    if variant == 3:
        return f" {address} "
    if variant == 4:
        return address[0].upper() + address[1:] + " "
    return address


def user_profile_id(store: Store, row: int) -> str:
    return guid_text(store.buyers.uid_hi[row], store.buyers.uid_lo[row])


def customer_document(store: Store, row: int) -> dict[str, Any]:
    """Master Data v1 CL document (all fields, i.e. ``_fields=_all``)."""
    buyers = store.buyers
    return {
        "id": guid_text(buyers.cl_id_hi[row], buyers.cl_id_lo[row]),
        "accountId": store.account_guid,
        "accountName": store.account,
        "dataEntityId": "CL",
        "userId": user_profile_id(store, row),
        "email": customer_email(store, row),
        "firstName": vocab.FIRST_NAMES[buyers.first_name[row]],
        "lastName": _last_name(store, row),
        "document": f"{int(buyers.document[row]):011d}",
        "documentType": "cpf",
        "phone": _phone(store, row, int(buyers.phone_format[row])),
        "isNewsletterOptIn": bool(buyers.newsletter[row]),
        "createdIn": format_ticks(buyers.created[row], zulu=True),
        "updatedIn": format_ticks(buyers.updated[row], zulu=True),
    }


def _address(store: Store, buyer: int, receiver: str, address_id: str) -> dict[str, Any]:
    buyers = store.buyers
    city, state, _, cep, lat, lon, _ = vocab.CITIES[buyers.city[buyer]]
    suffix = int(buyers.cep_suffix[buyer])
    jitter = (suffix - 500) / 20_000  # spread buyers around the city centre
    return {
        "addressType": "residential",
        "receiverName": receiver,
        "addressId": address_id,
        "versionId": None,
        "entityId": None,
        "postalCode": f"{cep:05d}-{suffix:03d}",
        "city": city,
        "state": state,
        "country": "BRA",
        "street": vocab.STREETS[buyers.street[buyer]],
        "number": str(int(buyers.street_number[buyer])),
        "neighborhood": vocab.NEIGHBORHOODS[(buyer + suffix) % len(vocab.NEIGHBORHOODS)],
        "complement": vocab.COMPLEMENTS[buyers.complement[buyer]],
        "reference": None,
        "geoCoordinates": [round(lon + jitter, 6), round(lat - jitter, 6)],
    }


# ----- catalog ----------------------------------------------------------------------------------


def product_name(store: Store, row: int) -> str:
    catalog = store.catalog
    nouns = vocab.CATEGORIES[catalog.product_category[row]][3]
    return (
        f"{nouns[catalog.product_noun[row]]} "
        f"{vocab.PRODUCT_ADJECTIVES[catalog.product_adjective[row]]} "
        f"{vocab.PRODUCT_LINES[catalog.product_line[row]]}"
    )


def sku_name(store: Store, row: int) -> str:
    catalog = store.catalog
    return f"{vocab.SKU_COLORS[catalog.sku_color[row]]} {vocab.SKU_SIZES[catalog.sku_size[row]]}"


def _product_link(store: Store, row: int) -> str:
    return f"{vocab.slug(product_name(store, row))}-{int(store.catalog.product_id[row])}"


def _image_url(store: Store, sku_row: int) -> str:
    sku_id = int(store.catalog.sku_id[sku_row])
    return f"https://{store.account}.vteximg.com.br/arquivos/ids/{sku_id}/{sku_id}.jpg"


def _release_date(store: Store, row: int) -> str:
    return format_ticks(int(store.catalog.product_release_day[row]) * TICKS_PER_DAY)[:19]


def product_document(store: Store, row: int) -> dict[str, Any]:
    """``GET /api/catalog/pvt/product/{productId}``."""
    catalog = store.catalog
    name = product_name(store, row)
    category_id, department_id, category_name, _ = vocab.CATEGORIES[catalog.product_category[row]]
    brand_name = vocab.BRANDS[catalog.product_brand[row]][1]
    description = f"{name} da marca {brand_name}, categoria {category_name}."
    return {
        "Id": int(catalog.product_id[row]),
        "Name": name,
        "DepartmentId": department_id,
        "CategoryId": category_id,
        "BrandId": vocab.BRANDS[catalog.product_brand[row]][0],
        "LinkId": _product_link(store, row),
        "RefId": f"REF-{int(catalog.product_id[row]):06d}",
        "IsVisible": bool(catalog.product_active[row]),
        "Description": description,
        "DescriptionShort": name,
        "ReleaseDate": _release_date(store, row),
        "KeyWords": ", ".join(name.lower().split()),
        "Title": f"{name} | {brand_name}",
        "IsActive": bool(catalog.product_active[row]),
        "TaxCode": "",
        "MetaTagDescription": description,
        "SupplierId": None,
        "ShowWithoutStock": True,
        "AdWordsRemarketingCode": "",
        "LomadeeCampaignCode": "",
        "Score": 0,
    }


def sku_document(store: Store, row: int) -> dict[str, Any]:
    """``GET /api/catalog_system/pvt/sku/stockkeepingunitbyid/{skuId}`` (SKU and context)."""
    catalog = store.catalog
    product = int(catalog.sku_product[row])
    sku_id = int(catalog.sku_id[row])
    product_id = int(catalog.product_id[product])
    name = product_name(store, product)
    variant = sku_name(store, row)
    category_id, department_id, category_name, _ = vocab.CATEGORIES[
        catalog.product_category[product]
    ]
    brand_id, brand_name = vocab.BRANDS[catalog.product_brand[product]]
    height, width, length = (int(v) for v in catalog.sku_dimensions[row])
    weight = int(catalog.sku_weight[row])
    ean = str(int(catalog.sku_ean[row]))
    ref_id = f"REF-{product_id:06d}-{row - int(catalog.product_sku_start[product]) + 1}"
    cubic_weight = round(height * width * length / 6000, 4)
    color, size = variant.split(" ")
    return {
        "Id": sku_id,
        "ProductId": product_id,
        "NameComplete": f"{name} {variant}",
        "ComplementName": "",
        "ProductName": name,
        "ProductDescription": f"{name} da marca {brand_name}.",
        "ProductRefId": f"REF-{product_id:06d}",
        "TaxCode": "",
        "SkuName": variant,
        "IsActive": bool(catalog.sku_active[row]),
        "IsTransported": True,
        "IsInventoried": True,
        "IsGiftCardRecharge": False,
        "ImageUrl": _image_url(store, row),
        "DetailUrl": f"/{_product_link(store, product)}/p",
        "CSCIdentification": None,
        "BrandId": str(brand_id),
        "BrandName": brand_name,
        "IsBrandActive": True,
        "Dimension": {
            "cubicweight": cubic_weight,
            "height": height,
            "length": length,
            "weight": weight,
            "width": width,
        },
        "RealDimension": {
            "realCubicWeight": cubic_weight,
            "realHeight": height,
            "realLength": length,
            "realWeight": weight,
            "realWidth": width,
        },
        "ManufacturerCode": "",
        "IsKit": False,
        "KitItems": [],
        "Services": [],
        "Categories": [],
        "CategoriesFullPath": [f"/{department_id}/{category_id}/", f"/{department_id}/"],
        "Attachments": [],
        "Collections": [],
        "SkuSellers": [
            {
                "SellerId": "1",
                "StockKeepingUnitId": sku_id,
                "SellerStockKeepingUnitId": str(sku_id),
                "IsActive": bool(catalog.sku_active[row]),
                "FreightCommissionPercentage": 0,
                "ProductCommissionPercentage": 0,
            }
        ],
        "SalesChannels": [1],
        "Images": [{"ImageUrl": _image_url(store, row), "ImageName": variant, "FileId": sku_id}],
        "Videos": [],
        "SkuSpecifications": [
            {
                "FieldId": 101,
                "FieldName": "Cor",
                "FieldValueIds": [1000 + int(catalog.sku_color[row])],
                "FieldValues": [color],
            },
            {
                "FieldId": 102,
                "FieldName": "Tamanho",
                "FieldValueIds": [2000 + int(catalog.sku_size[row])],
                "FieldValues": [size],
            },
        ],
        "ProductSpecifications": [],
        "ProductClustersIds": "",
        "ProductCategoryIds": f"/{department_id}/{category_id}/",
        "IsDirectCategoryActive": True,
        "ProductGlobalCategoryId": None,
        "ProductCategories": {
            str(category_id): category_name,
            str(department_id): vocab.DEPARTMENTS[department_id],
        },
        "CommercialConditionId": 1,
        "RewardValue": 0.0,
        "AlternateIds": {"Ean": ean, "RefId": ref_id},
        "AlternateIdValues": [ean, ref_id],
        "EstimatedDateArrival": None,
        "MeasurementUnit": "un",
        "UnitMultiplier": 1.0,
        "InformationSource": "Indexer",
        "ModalType": None,
        "KeyWords": None,
        "ReleaseDate": _release_date(store, product),
        "ProductIsVisible": bool(catalog.product_active[product]),
        "ShowIfNotAvailable": True,
        "IsProductActive": bool(catalog.product_active[product]),
        "ProductFinalScore": 0,
    }


# ----- orders -----------------------------------------------------------------------------------


def _optional_time(ticks: np.int64) -> str | None:
    return format_ticks(int(ticks)) if ticks else None


def order_list_item(store: Store, row: int) -> dict[str, Any]:
    """One ``list`` entry of ``GET /api/oms/pvt/orders`` (index data: no items, no lastChange)."""
    orders = store.orders
    buyer = int(orders.buyer[row])
    status = int(orders.status[row])
    return {
        "orderId": store.order_id_at(row),
        "creationDate": format_ticks(orders.created[row]),
        "clientName": f"{vocab.FIRST_NAMES[store.buyers.first_name[buyer]]} "
        f"{_last_name(store, buyer)}",
        "items": None,
        "totalValue": int(orders.value[row]),
        "paymentNames": vocab.PAYMENT_SYSTEMS[orders.payment[row]][1],
        "status": STATUSES[status],
        "statusDescription": STATUS_DESCRIPTIONS[status],
        "marketPlaceOrderId": None,
        "sequence": store.sequence_at(row),
        "salesChannel": "1",
        "affiliateId": "",
        "origin": "Marketplace",
        "workflowInErrorState": False,
        "workflowInRetry": False,
        "lastMessageUnread": None,
        "ShippingEstimatedDate": None,
        "ShippingEstimatedDateMax": None,
        "ShippingEstimatedDateMin": None,
        "orderIsComplete": True,
        "listId": None,
        "listType": None,
        "authorizedDate": _optional_time(orders.authorized[row]),
        "callCenterOperatorName": None,
        "totalItems": int(orders.quantity[row]),
        "currencyCode": "BRL",
    }


def order_document(store: Store, row: int) -> dict[str, Any]:
    """``GET /api/oms/pvt/orders/{orderId}`` for a well-formed order."""
    orders, buyers, catalog = store.orders, store.buyers, store.catalog
    account = store.account
    order_id = store.order_id_at(row)
    group = order_id[:-3]
    sequence = store.sequence_at(row)
    status = int(orders.status[row])
    buyer = int(orders.buyer[row])
    profile_id = user_profile_id(store, buyer)
    first_name = vocab.FIRST_NAMES[buyers.first_name[buyer]]
    last_name = _last_name(store, buyer)
    created = format_ticks(orders.created[row])
    last_change = format_ticks(orders.last_change[row])
    authorized = _optional_time(orders.authorized[row])
    invoiced = _optional_time(orders.invoiced[row])
    value = int(orders.value[row])
    shipping = int(orders.shipping[row])
    payment_id, payment_name, payment_group, _ = vocab.PAYMENT_SYSTEMS[orders.payment[row]]
    address_id = _hex("address", profile_id)[:13]
    address = _address(store, buyer, f"{first_name} {last_name}", address_id)
    estimate_days = 3 + int(orders.group[row] % 7)
    estimate_date = format_ticks(int(orders.created[row]) + estimate_days * TICKS_PER_DAY)
    courier = vocab.COURIERS[orders.courier[row]]

    items: list[dict[str, Any]] = []
    metadata: list[dict[str, Any]] = []
    logistics: list[dict[str, Any]] = []
    package_items: list[dict[str, Any]] = []
    start, stop = int(orders.item_start[row]), int(orders.item_start[row + 1])
    for index, item in enumerate(range(start, stop)):
        sku = int(orders.item_sku[item])
        product = int(catalog.sku_product[sku])
        sku_id = str(int(catalog.sku_id[sku]))
        product_id = str(int(catalog.product_id[product]))
        category_id, department_id, _, _ = vocab.CATEGORIES[catalog.product_category[product]]
        brand_id, brand_name = vocab.BRANDS[catalog.product_brand[product]]
        variant = sku_name(store, sku)
        name = f"{product_name(store, product)} {variant}"
        ref_id = (
            f"REF-{int(catalog.product_id[product]):06d}-"
            f"{sku - int(catalog.product_sku_start[product]) + 1}"
        )
        ean = str(int(catalog.sku_ean[sku]))
        image = _image_url(store, sku)
        detail = f"/{_product_link(store, product)}/p"
        quantity = int(orders.item_quantity[item])
        price = int(orders.item_price[item])
        selling = int(orders.item_selling_price[item])
        items.append(
            {
                "uniqueId": _hex("item", order_id, index).upper(),
                "id": sku_id,
                "productId": product_id,
                "ean": ean,
                "quantity": quantity,
                "seller": "1",
                "name": name,
                "refId": ref_id,
                "price": price,
                "listPrice": int(orders.item_list_price[item]),
                "manualPrice": None,
                "priceTags": [],
                "imageUrl": image,
                "detailUrl": detail,
                "sellerSku": sku_id,
                "tax": 0,
                "additionalInfo": {
                    "brandName": brand_name,
                    "brandId": str(brand_id),
                    "categoriesIds": f"/{department_id}/{category_id}/",
                    "productClusterId": "",
                    "commercialConditionId": "1",
                },
                "measurementUnit": "un",
                "unitMultiplier": 1,
                "sellingPrice": selling,
                "isGift": False,
                "priceDefinitions": {
                    "sellingPrices": [{"value": selling, "quantity": quantity}],
                    "calculatedSellingPrice": selling,
                    "total": selling * quantity,
                },
                "parentItemIndex": None,
            }
        )
        metadata.append(
            {
                "Id": sku_id,
                "Seller": "1",
                "Name": name,
                "SkuName": variant,
                "ProductId": product_id,
                "RefId": ref_id,
                "Ean": ean,
            }
        )
        item_shipping = shipping if index == 0 else 0  # VTEX attributes freight per item
        logistics.append(
            {
                "itemIndex": index,
                "selectedSla": "Normal",
                "price": item_shipping,
                "deliveryCompany": courier,
                "shippingEstimate": f"{estimate_days}bd",
                "shippingEstimateDate": estimate_date,
                "selectedDeliveryChannel": "delivery",
                "addressId": address_id,
            }
        )
        package_items.append({"itemIndex": index, "quantity": quantity, "price": selling})

    packages: list[dict[str, Any]] = []
    if status == INVOICED:
        packages.append(
            {
                "items": package_items,
                "courier": courier,
                "invoiceNumber": sequence,
                "invoiceValue": value,
                "invoiceUrl": None,
                "issuanceDate": invoiced,
                "trackingNumber": f"BR{int(orders.group[row]) % 1_000_000_000:09d}BR",
                "invoiceKey": None,
                "trackingUrl": None,
                "embeddedInvoice": "",
                "type": "Output",
                "courierStatus": None,
                "cfop": None,
                "restitutions": {},
                "volumes": 1,
                "EnableInferItems": None,
            }
        )

    canceled = status == CANCELED
    reason = vocab.CANCEL_REASONS[orders.cancel_reason[row]] if canceled else None
    utm = int(orders.utm[row])
    marketing = None
    if utm >= 0:
        campaigns, mediums = len(vocab.UTM_CAMPAIGNS), len(vocab.UTM_MEDIUMS)
        marketing = {
            "id": "marketingData",
            "utmSource": vocab.UTM_SOURCES[utm // (campaigns * mediums)],
            "utmPartner": "",
            "utmMedium": vocab.UTM_MEDIUMS[utm // campaigns % mediums],
            "utmCampaign": vocab.UTM_CAMPAIGNS[utm % campaigns],
            "coupon": "",
            "utmiCampaign": "",
            "utmipage": "",
            "utmiPart": "",
            "marketingTags": [],
        }
    is_card = payment_group == "creditCard"
    transaction_id = _hex("transaction", order_id).upper()
    document = f"{int(buyers.document[buyer]):011d}"

    return {
        "orderId": order_id,
        "sequence": sequence,
        "marketplaceOrderId": "",
        "sellerOrderId": f"00-{order_id}",
        "origin": "Marketplace",
        "affiliateId": "",
        "salesChannel": "1",
        "merchantName": None,
        "status": STATUSES[status],
        "workflowIsInError": False,
        "statusDescription": STATUS_DESCRIPTIONS[status],
        "value": value,
        "creationDate": created,
        "lastChange": last_change,
        "orderGroup": group,
        "totals": [
            {"id": "Items", "name": "Total dos Itens", "value": int(orders.items_total[row])},
            {"id": "Discounts", "name": "Total dos Descontos", "value": int(orders.discounts[row])},
            {"id": "Shipping", "name": "Total do Frete", "value": shipping},
            {"id": "Tax", "name": "Total da Taxa", "value": 0},
        ],
        "items": items,
        "marketplaceItems": [],
        "clientProfileData": {
            "id": "clientProfileData",
            "email": masked_email(account, profile_id),
            "firstName": first_name,
            "lastName": last_name,
            "documentType": "cpf",
            "document": document,
            "phone": _phone(store, buyer, 0),
            "corporateName": None,
            "tradeName": None,
            "corporateDocument": None,
            "stateInscription": None,
            "corporatePhone": None,
            "isCorporate": False,
            "userProfileId": profile_id,
            "userProfileVersion": None,
            "customerClass": None,
            "customerCode": None,
        },
        "marketingData": marketing,
        "ratesAndBenefitsData": {"id": "ratesAndBenefitsData", "rateAndBenefitsIdentifiers": []},
        "shippingData": {
            "id": "shippingData",
            "address": address,
            "logisticsInfo": logistics,
            "trackingHints": None,
        },
        "paymentData": {
            "giftCards": [],
            "transactions": [
                {
                    "isActive": True,
                    "transactionId": transaction_id,
                    "merchantName": account.upper(),
                    "payments": [
                        {
                            "id": _hex("payment", order_id).upper(),
                            "paymentSystem": payment_id,
                            "paymentSystemName": payment_name,
                            "value": value,
                            "installments": int(orders.installments[row]),
                            "referenceValue": value,
                            "firstDigits": "411111" if is_card else None,
                            "lastDigits": f"{int(orders.group[row]) % 10_000:04d}"
                            if is_card
                            else None,
                            "url": (
                                f"https://{account}.vtexpayments.com.br/BankIssuedInvoice/"
                                f"Transaction/{transaction_id}/Print"
                                if payment_group == "bankInvoice"
                                else None
                            ),
                            "group": payment_group,
                            "tid": _hex("tid", order_id)[:20],
                            "dueDate": None,
                        }
                    ],
                }
            ],
        },
        "packageAttachment": {"packages": packages},
        "sellers": [
            {
                "id": "1",
                "name": account.capitalize(),
                "logo": "",
                "fulfillmentEndpoint": (
                    f"http://fulfillment.vtexcommerce.com.br/api/fulfillment?an={account}"
                ),
            }
        ],
        "followUpEmail": f"{_hex('follow-up', account, order_id)}@ct.vtex.com.br",
        "lastMessage": None,
        "hostname": account,
        "roundingError": 0,
        "orderFormId": _hex("orderform", order_id),
        "isCompleted": True,
        "storePreferencesData": _STORE_PREFERENCES,
        "allowCancellation": status in _OPEN_STATUSES,
        "allowEdition": False,
        "isCheckedIn": False,
        "authorizedDate": authorized,
        "invoicedDate": invoiced,
        "cancelReason": reason,
        "itemMetadata": {"Items": metadata},
        "cancellationData": None
        if not canceled
        else {
            "RequestedByUser": bool(orders.cancel_reason[row] == 0),
            "RequestedBySystem": authorized is None,
            "RequestedBySellerNotification": False,
            "RequestedByPaymentNotification": bool(orders.cancel_reason[row] == 1),
            "Reason": reason,
            "CancellationDate": last_change,
        },
        "clientPreferencesData": {
            "locale": "pt-BR",
            "optinNewsLetter": bool(buyer < buyers.registered and buyers.newsletter[buyer]),
        },
    }


def order_bytes(store: Store, row: int) -> bytes:
    """Body of the order-detail endpoint; malformed orders are broken in their assigned way."""
    document = order_document(store, row)
    kind = int(store.orders.malformed[row])
    if kind == _UNPARSEABLE:
        body = orjson.dumps(document)
        return body[: len(body) * 3 // 5]
    if kind == _NO_LAST_CHANGE:
        del document["lastChange"]
    elif kind == _TEXT_VALUE:
        value = int(store.orders.value[row])
        document["value"] = f"R$ {value // 100},{value % 100:02d}"
    elif kind == _NO_ORDER_ID:
        del document["orderId"]
    return orjson.dumps(document)
